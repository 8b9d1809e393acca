// placeholder: replaced by the ring kernels
#include "device_abi.h"
extern "C" __global__ void fnPlaceholder(fnKernelArgs args) {}
