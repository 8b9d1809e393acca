//! NCCL_* parameters, read once (from `param`) and cached, as NCCL's `NCCL_PARAM` does; a value
//! read from the environment or the configuration file is logged once (INFO, or WARN if invalid).

/// Declares a cached integer parameter: `int_param!(buffsize, "NCCL_BUFFSIZE", 4 << 20);`.
#[macro_export]
macro_rules! int_param {
    ($(#[$m:meta])* $fn:ident, $name:literal, $default:expr) => {
        $(#[$m])*
        pub fn $fn() -> i64 {
            static V: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
            *V.get_or_init(|| match $crate::param::get($name) {
                None => $default,
                Some(s) => match $crate::param::parse_i64(&s) {
                    Some(v) => {
                        $crate::nccl_info!($crate::debug::Subsys::ENV, "{} set by environment to {}", $name, v);
                        v
                    }
                    None => {
                        $crate::nccl_warn!("Invalid value {:?} for {}, using default {}", s, $name, $default);
                        $default
                    }
                },
            })
        }
    };
}

/// Declares a cached string parameter.
#[macro_export]
macro_rules! str_param {
    ($(#[$m:meta])* $fn:ident, $name:literal) => {
        $(#[$m])*
        pub fn $fn() -> Option<&'static str> {
            static V: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
            V.get_or_init(|| $crate::param::get($name)).as_deref()
        }
    };
}

int_param!(
    /// Seconds a bootstrap wait (root, peers, ring) may take before it fails naming who is missing.
    bootstrap_timeout_s, "NCCL_BOOTSTRAP_TIMEOUT", 120
);
str_param!(
    /// `NCCL_COMM_ID=<host>:<port>`: a fixed root address instead of a fresh listener.
    comm_id, "NCCL_COMM_ID"
);
str_param!(
    /// Interface selection for bootstrap sockets, NCCL's syntax (`eth`, `^docker`, `=eth0`).
    socket_ifname, "NCCL_SOCKET_IFNAME"
);
str_param!(
    /// Overrides the host identity used to decide which ranks share a machine.
    hostid, "NCCL_HOSTID"
);
