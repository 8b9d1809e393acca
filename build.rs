//! Build script: compiles `kernels/*.cu` with nvcc 13.0 into fatbins embedded in the library,
//! binds `kernels/device_abi.h` into Rust with bindgen, and gives the cdylib NCCL's SONAME.

use std::path::{Path, PathBuf};
use std::process::Command;

const NVCC_HELP: &str = "nvcc 13.0 was not found. ferronickel's CUDA kernels need it to build.\n\
  Install it from PyPI:  python3 -m pip install nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 \
nvidia-nvvm==13.0.88 nvidia-cuda-runtime==13.0.96\n\
  or point NVCC=/path/to/nvcc or CUDA_HOME=/usr/local/cuda at an installed toolkit.";

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let kernels = manifest.join("kernels");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");

    compile_kernels(&kernels, &out);
    bind_device_abi(&kernels, &out);

    // The loader matches `NEEDED libnccl.so.2` (PyTorch, nccl-tests) against this SONAME.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    link_soname_file(&out);
}

/// nvcc from $NVCC, $CUDA_HOME, /usr/local/cuda, PATH, or the PyPI wheels of this python3.
fn find_nvcc() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(p) = std::env::var("NVCC") {
        candidates.push(p.into());
    }
    if let Ok(h) = std::env::var("CUDA_HOME") {
        candidates.push(Path::new(&h).join("bin/nvcc"));
    }
    candidates.push("/usr/local/cuda/bin/nvcc".into());
    if let Some(paths) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&paths).map(|d| d.join("nvcc")));
    }
    let py = Command::new("python3")
        .args(["-c", "import nvidia, os; print('\\n'.join(os.path.join(p, 'cu13', 'bin', 'nvcc') for p in nvidia.__path__))"])
        .output();
    if let Ok(o) = py {
        candidates.extend(String::from_utf8_lossy(&o.stdout).lines().map(PathBuf::from));
    }
    candidates.into_iter().find(|p| p.is_file())
}

fn compile_kernels(kernels: &Path, out: &Path) {
    let mut sources: Vec<PathBuf> = std::fs::read_dir(kernels)
        .expect("kernels/ directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    sources.sort();
    for p in &sources {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    let nvcc = find_nvcc().unwrap_or_else(|| panic!("{NVCC_HELP}"));
    let cu: Vec<&PathBuf> = sources.iter().filter(|p| p.extension().is_some_and(|e| e == "cu")).collect();
    assert!(!cu.is_empty(), "no kernels/*.cu found: the library would have no GPU code");

    // Each .cu becomes its own fatbin (its own CUmodule at run time), compiled in parallel.
    let cache = kernel_cache(&nvcc, &sources);
    let jobs: Vec<_> = cu
        .iter()
        .map(|src| {
            let stem = src.file_stem().unwrap().to_string_lossy().into_owned();
            let fatbin = out.join(format!("{stem}.fatbin"));
            if let Some(hit) = cache.as_ref().map(|c| c.join(format!("{stem}.fatbin"))).filter(|f| f.is_file()) {
                std::fs::copy(&hit, &fatbin).unwrap_or_else(|e| panic!("copying {}: {e}", hit.display()));
                return (stem, fatbin, String::new(), None);
            }
            if let Some(dir) = &cache {
                println!("cargo:warning=compiling kernels/{stem}.cu with nvcc (takes minutes; kept in {})", dir.display());
            }
            let mut cmd = Command::new(&nvcc);
            cmd.args(["-fatbin", "-O3", "-std=c++17", "--threads", "0", "-Xptxas", "-warn-spills"])
                .args(["-gencode", "arch=compute_80,code=sm_80"])
                .args(["-gencode", "arch=compute_90,code=sm_90"])
                .args(["-gencode", "arch=compute_90,code=compute_90"])
                .arg("-I")
                .arg(kernels)
                .arg(src)
                .arg("-o")
                .arg(&fatbin);
            let shown = format!("{cmd:?}");
            (stem, fatbin, shown, Some(cmd.spawn()))
        })
        .collect();

    let mut table = String::from("/// Fatbins compiled from kernels/*.cu, one CUDA module each.\npub static FATBINS: &[(&str, &[u8])] = &[\n");
    for (stem, fatbin, shown, child) in jobs {
        if let Some(child) = child {
            let child = child.unwrap_or_else(|e| panic!("could not run nvcc ({e}): {shown}\n{NVCC_HELP}"));
            let res = child.wait_with_output().expect("waiting for nvcc");
            if !res.status.success() {
                panic!(
                    "nvcc failed on kernels/{stem}.cu\ncommand: {shown}\nstdout:\n{}\nstderr:\n{}",
                    String::from_utf8_lossy(&res.stdout),
                    String::from_utf8_lossy(&res.stderr)
                );
            }
            if let Some(dir) = &cache {
                // Best effort: a failed store costs the next build a compile, nothing else.
                let _ = std::fs::create_dir_all(dir).and_then(|_| std::fs::copy(&fatbin, dir.join(format!("{stem}.fatbin"))));
            }
        }
        table.push_str(&format!("    ({stem:?}, include_bytes!({:?})),\n", fatbin.display().to_string()));
    }
    table.push_str("];\n");
    std::fs::write(out.join("fatbins.rs"), table).unwrap();
}

/// Where compiled fatbins are kept between builds and checkouts: `$FERRONICKEL_CACHE/kernels/<key>`
/// (default `~/.cache/ferronickel`), the key a hash of nvcc's identity and every file in
/// `kernels/`, so any change to a kernel, a header or the compiler misses the cache. `None` (always
/// compile) when `FERRONICKEL_KERNEL_CACHE=0` or no cache directory is known.
fn kernel_cache(nvcc: &Path, sources: &[PathBuf]) -> Option<PathBuf> {
    println!("cargo:rerun-if-env-changed=FERRONICKEL_CACHE");
    println!("cargo:rerun-if-env-changed=FERRONICKEL_KERNEL_CACHE");
    if std::env::var("FERRONICKEL_KERNEL_CACHE").is_ok_and(|v| v == "0") {
        return None;
    }
    let base = match std::env::var_os("FERRONICKEL_CACHE") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(std::env::var_os("HOME")?).join(".cache/ferronickel"),
    };
    let version = Command::new(nvcc).arg("--version").output().ok()?.stdout;
    // Two FNV-1a passes with different offsets: 128 bits, enough that distinct inputs never meet.
    let mut h = [0xcbf29ce484222325u64, 0x84222325cbf29ce4u64];
    let mut feed = |bytes: &[u8]| {
        for x in h.iter_mut() {
            for &b in bytes.iter().chain(&(bytes.len() as u64).to_le_bytes()) {
                *x = (*x ^ b as u64).wrapping_mul(0x100000001b3);
            }
        }
    };
    feed(nvcc.as_os_str().as_encoded_bytes());
    feed(&version);
    feed(include_bytes!("build.rs"));
    for p in sources {
        feed(p.file_name()?.as_encoded_bytes());
        feed(&std::fs::read(p).ok()?);
    }
    Some(base.join("kernels").join(format!("{:016x}{:016x}", h[0], h[1])))
}

fn bind_device_abi(kernels: &Path, out: &Path) {
    let header = kernels.join("device_abi.h");
    let bindings = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .allowlist_type("fn.*")
        .allowlist_var("FN_.*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(true)
        .generate()
        .unwrap_or_else(|e| panic!("bindgen failed on {} ({e}); it needs libclang: apt-get install libclang-dev", header.display()));
    bindings.write_to_file(out.join("device_abi.rs")).unwrap();
}

/// `target/<profile>/libnccl.so.2` pointing at the cdylib, the name loaders and LD_PRELOAD use.
fn link_soname_file(out: &Path) {
    // OUT_DIR is target/<profile>/build/<pkg>-<hash>/out.
    let Some(profile_dir) = out.ancestors().nth(3) else { return };
    let link = profile_dir.join("libnccl.so.2");
    if std::fs::symlink_metadata(&link).is_err() {
        let _ = std::os::unix::fs::symlink("libnccl.so", &link);
    }
}
