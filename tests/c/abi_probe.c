/*
 * ABI probe, compiled by tests/abi.rs four times: as C and as C++, once against
 * ferronickel's include/nccl.h and once against NVIDIA's nccl.h 2.28.9. It prints every
 * layout fact, enumerator, macro value and initializer the two headers define, one
 * "name = value" line each; the test requires the outputs for one language to be identical.
 * Anything one header lacks fails to compile, which fails the test as well.
 */
#include <nccl.h>

#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* The spelled-out type of an expression, so that a field declared with another type of the
 * same size (int vs unsigned, const char* vs void*) still shows up as a difference. */
#ifdef __cplusplus
#include <type_traits>
/* decltype does not evaluate its operand, like _Generic; arrays decay as they do in C. */
template <class T> struct TN { static const char* name() { return "other"; } };
#define TN_(T) template <> struct TN<T> { static const char* name() { return #T; } };
TN_(char)
TN_(signed char)
TN_(unsigned char)
TN_(short)
TN_(unsigned short)
TN_(int)
TN_(unsigned int)
TN_(long)
TN_(unsigned long)
TN_(long long)
TN_(unsigned long long)
TN_(float)
TN_(double)
TN_(const char*)
TN_(char*)
TN_(const void*)
TN_(void*)
#define TYPE_NAME(x) TN<std::decay<decltype(x)>::type>::name()
#else
#define TYPE_NAME(x) _Generic((x), \
    char: "char", signed char: "signed char", unsigned char: "unsigned char", \
    short: "short", unsigned short: "unsigned short", int: "int", unsigned int: "unsigned int", \
    long: "long", unsigned long: "unsigned long", long long: "long long", \
    unsigned long long: "unsigned long long", float: "float", double: "double", \
    const char*: "const char*", char*: "char*", const void*: "const void*", void*: "void*", \
    default: "other")
#endif

#define TYPE(T) printf("sizeof(%s) = %zu\nalignof(%s) = %zu\n", #T, sizeof(T), #T, (size_t)ALIGN_OF(T))
#ifdef __cplusplus
#define ALIGN_OF(T) alignof(T)
#else
#define ALIGN_OF(T) _Alignof(T)
#endif

#define FIELD(S, f) do { S s_; \
    printf("%s.%s: offset = %zu, size = %zu, type = %s\n", #S, #f, offsetof(S, f), sizeof(s_.f), TYPE_NAME(s_.f)); \
  } while (0)

/* Enumerators and integer macros: the value, and the width of the expression. */
#define INTV(x) printf("%s = %lld (sizeof %zu)\n", #x, (long long)(x), sizeof(x))

static void dump_bytes(const char* what, const void* p, size_t n) {
  const unsigned char* b = (const unsigned char*)p;
  size_t i;
  printf("%s bytes =", what);
  for (i = 0; i < n; i++) printf(" %02x", b[i]);
  printf("\n");
}

static const char* ptr_state(const void* p) { return p == NULL ? "NULL" : "non-NULL"; }

int main(void) {
  /* ---- version macros, also as the preprocessor sees them ---- */
  INTV(NCCL_MAJOR);
  INTV(NCCL_MINOR);
  INTV(NCCL_PATCH);
  printf("NCCL_SUFFIX = \"%s\" (sizeof %zu)\n", NCCL_SUFFIX, sizeof(NCCL_SUFFIX));
  INTV(NCCL_VERSION_CODE);
  INTV(NCCL_VERSION(2, 28, 9));
  INTV(NCCL_VERSION(2, 8, 3));
  INTV(NCCL_VERSION(2, 8, 99));
  INTV(NCCL_VERSION(2, 9, 0));
  INTV(NCCL_VERSION(1, 9, 0));
  INTV(NCCL_VERSION(3, 0, 1));
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0) && NCCL_VERSION_CODE < NCCL_VERSION(2, 29, 0)
  printf("#if NCCL_VERSION_CODE in [2.28.0, 2.29.0) = yes\n");
#else
  printf("#if NCCL_VERSION_CODE in [2.28.0, 2.29.0) = no\n");
#endif
#if NCCL_MAJOR == 2 && NCCL_MINOR == 28 && NCCL_PATCH == 9
  printf("#if NCCL_MAJOR/MINOR/PATCH == 2/28/9 = yes\n");
#else
  printf("#if NCCL_MAJOR/MINOR/PATCH == 2/28/9 = no\n");
#endif

  /* ---- other macros ---- */
  INTV(NCCL_UNIQUE_ID_BYTES);
  INTV(NCCL_CONFIG_UNDEF_INT);
  printf("NCCL_CONFIG_UNDEF_PTR = %s\n", ptr_state(NCCL_CONFIG_UNDEF_PTR));
  printf("NCCL_COMM_NULL = %s\n", ptr_state(NCCL_COMM_NULL));
  INTV(NCCL_SPLIT_NOCOLOR);
  printf("NCCL_UNDEF_FLOAT = %a (sizeof %zu, type %s)\n", (double)NCCL_UNDEF_FLOAT, sizeof(NCCL_UNDEF_FLOAT),
         TYPE_NAME(NCCL_UNDEF_FLOAT));
  INTV(NCCL_WIN_DEFAULT);
  INTV(NCCL_WIN_COLL_SYMMETRIC);
  INTV(NCCL_WIN_REQUIRED_ALIGNMENT);
  INTV(NCCL_CTA_POLICY_DEFAULT);
  INTV(NCCL_CTA_POLICY_EFFICIENCY);
  INTV(NCCL_CTA_POLICY_ZERO);
  INTV(NCCL_SHRINK_DEFAULT);
  INTV(NCCL_SHRINK_ABORT);
  INTV(NCCL_REVOKE_DEFAULT);

  /* ---- enums ---- */
  TYPE(ncclResult_t);
  INTV(ncclSuccess);
  INTV(ncclUnhandledCudaError);
  INTV(ncclSystemError);
  INTV(ncclInternalError);
  INTV(ncclInvalidArgument);
  INTV(ncclInvalidUsage);
  INTV(ncclRemoteError);
  INTV(ncclInProgress);
  INTV(ncclNumResults);

  TYPE(ncclRedOp_dummy_t);
  INTV(ncclNumOps_dummy);
  TYPE(ncclRedOp_t);
  INTV(ncclSum);
  INTV(ncclProd);
  INTV(ncclMax);
  INTV(ncclMin);
  INTV(ncclAvg);
  INTV(ncclNumOps);
  INTV(ncclMaxRedOp);

  TYPE(ncclDataType_t);
  INTV(ncclInt8);
  INTV(ncclChar);
  INTV(ncclUint8);
  INTV(ncclInt32);
  INTV(ncclInt);
  INTV(ncclUint32);
  INTV(ncclInt64);
  INTV(ncclUint64);
  INTV(ncclFloat16);
  INTV(ncclHalf);
  INTV(ncclFloat32);
  INTV(ncclFloat);
  INTV(ncclFloat64);
  INTV(ncclDouble);
  INTV(ncclBfloat16);
  INTV(ncclFloat8e4m3);
  INTV(ncclFloat8e5m2);
  INTV(ncclNumTypes);

  TYPE(ncclScalarResidence_t);
  INTV(ncclScalarDevice);
  INTV(ncclScalarHostImmediate);
#ifdef __cplusplus
  /* Only C++ can name an enum's underlying type; C compilers pick the same one here. */
  printf("underlying(ncclResult_t) = %s\n", TN<std::underlying_type<ncclResult_t>::type>::name());
  printf("underlying(ncclRedOp_dummy_t) = %s\n", TN<std::underlying_type<ncclRedOp_dummy_t>::type>::name());
  printf("underlying(ncclRedOp_t) = %s\n", TN<std::underlying_type<ncclRedOp_t>::type>::name());
  printf("underlying(ncclDataType_t) = %s\n", TN<std::underlying_type<ncclDataType_t>::type>::name());
  printf("underlying(ncclScalarResidence_t) = %s\n", TN<std::underlying_type<ncclScalarResidence_t>::type>::name());
#endif

  /* ---- handles and structs ---- */
  TYPE(ncclComm_t);
  TYPE(ncclWindow_t);
  TYPE(ncclUniqueId);
  FIELD(ncclUniqueId, internal);
  {
    ncclUniqueId id;
    printf("ncclUniqueId.internal: elements = %zu, element type = %s\n", sizeof(id.internal) / sizeof(id.internal[0]),
           TYPE_NAME(id.internal[0]));
  }

  TYPE(ncclConfig_t);
  FIELD(ncclConfig_t, size);
  FIELD(ncclConfig_t, magic);
  FIELD(ncclConfig_t, version);
  FIELD(ncclConfig_t, blocking);
  FIELD(ncclConfig_t, cgaClusterSize);
  FIELD(ncclConfig_t, minCTAs);
  FIELD(ncclConfig_t, maxCTAs);
  FIELD(ncclConfig_t, netName);
  FIELD(ncclConfig_t, splitShare);
  FIELD(ncclConfig_t, trafficClass);
  FIELD(ncclConfig_t, commName);
  FIELD(ncclConfig_t, collnetEnable);
  FIELD(ncclConfig_t, CTAPolicy);
  FIELD(ncclConfig_t, shrinkShare);
  FIELD(ncclConfig_t, nvlsCTAs);
  FIELD(ncclConfig_t, nChannelsPerNetPeer);
  FIELD(ncclConfig_t, nvlinkCentricSched);

  TYPE(ncclSimInfo_t);
  FIELD(ncclSimInfo_t, size);
  FIELD(ncclSimInfo_t, magic);
  FIELD(ncclSimInfo_t, version);
  FIELD(ncclSimInfo_t, estimatedTime);

  /* ---- initializers: every field, then the bytes of a zeroed copy (padding stays 0) ---- */
  {
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    ncclConfig_t z;
    printf("CONFIG_INIT.size = %zu\n", c.size);
    printf("CONFIG_INIT.magic = 0x%x\n", c.magic);
    printf("CONFIG_INIT.version = %u\n", c.version);
    printf("CONFIG_INIT.blocking = %d\n", c.blocking);
    printf("CONFIG_INIT.cgaClusterSize = %d\n", c.cgaClusterSize);
    printf("CONFIG_INIT.minCTAs = %d\n", c.minCTAs);
    printf("CONFIG_INIT.maxCTAs = %d\n", c.maxCTAs);
    printf("CONFIG_INIT.netName = %s\n", ptr_state(c.netName));
    printf("CONFIG_INIT.splitShare = %d\n", c.splitShare);
    printf("CONFIG_INIT.trafficClass = %d\n", c.trafficClass);
    printf("CONFIG_INIT.commName = %s\n", ptr_state(c.commName));
    printf("CONFIG_INIT.collnetEnable = %d\n", c.collnetEnable);
    printf("CONFIG_INIT.CTAPolicy = %d\n", c.CTAPolicy);
    printf("CONFIG_INIT.shrinkShare = %d\n", c.shrinkShare);
    printf("CONFIG_INIT.nvlsCTAs = %d\n", c.nvlsCTAs);
    printf("CONFIG_INIT.nChannelsPerNetPeer = %d\n", c.nChannelsPerNetPeer);
    printf("CONFIG_INIT.nvlinkCentricSched = %d\n", c.nvlinkCentricSched);
    memset(&z, 0, sizeof z);
    z.size = c.size;
    z.magic = c.magic;
    z.version = c.version;
    z.blocking = c.blocking;
    z.cgaClusterSize = c.cgaClusterSize;
    z.minCTAs = c.minCTAs;
    z.maxCTAs = c.maxCTAs;
    z.netName = c.netName;
    z.splitShare = c.splitShare;
    z.trafficClass = c.trafficClass;
    z.commName = c.commName;
    z.collnetEnable = c.collnetEnable;
    z.CTAPolicy = c.CTAPolicy;
    z.shrinkShare = c.shrinkShare;
    z.nvlsCTAs = c.nvlsCTAs;
    z.nChannelsPerNetPeer = c.nChannelsPerNetPeer;
    z.nvlinkCentricSched = c.nvlinkCentricSched;
    dump_bytes("CONFIG_INIT", &z, sizeof z);
  }
  {
    ncclSimInfo_t s = NCCL_SIM_INFO_INITIALIZER;
    ncclSimInfo_t z;
    printf("SIM_INFO_INIT.size = %zu\n", s.size);
    printf("SIM_INFO_INIT.magic = 0x%x\n", s.magic);
    printf("SIM_INFO_INIT.version = %u\n", s.version);
    printf("SIM_INFO_INIT.estimatedTime = %a\n", (double)s.estimatedTime);
    memset(&z, 0, sizeof z);
    z.size = s.size;
    z.magic = s.magic;
    z.version = s.version;
    z.estimatedTime = s.estimatedTime;
    dump_bytes("SIM_INFO_INIT", &z, sizeof z);
  }
  printf("END\n");
  return 0;
}
