// What both stand-in libnvidia-ml.so.1 share: nvmlReturn_t's values they
// answer, with NVML's own texts for them, and the shutdown that has nothing
// to undo.
#ifndef STANDIN_NVML_COMMON_H
#define STANDIN_NVML_COMMON_H

enum {
  kSuccess = 0,
  kInvalidArgument = 2,
  kNotSupported = 3,
  kNotFound = 6,
  kDriverNotLoaded = 9,
  kTimeout = 10,
  kGpuIsLost = 15
};

int nvmlShutdown(void) { return kSuccess; }

const char* nvmlErrorString(int result) {
  switch (result) {
    case kSuccess:
      return "Success";
    case kInvalidArgument:
      return "Invalid Argument";
    case kNotSupported:
      return "Not Supported";
    case kNotFound:
      return "Not Found";
    case kDriverNotLoaded:
      return "Driver Not Loaded";
    case kTimeout:
      return "Timeout";
    case kGpuIsLost:
      return "GPU is lost";
  }
  return "Unknown Error";
}

#endif
