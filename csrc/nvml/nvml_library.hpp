// NVML, the driver's management library (libnvidia-ml.so.1), loaded with
// dlopen: it ships with the driver, not with pod-init, and a machine without a
// driver must still run everything else. The static pod-init never links
// this; pod-init-nvml and the Python extension do.
#pragma once

#include <stdexcept>
#include <string>

namespace pod_init::nvml {

// NVML's own types, as nvml.h declares them (the header is not needed to build).
using Return = int;  // nvmlReturn_t
using Device = void*;
using EventSet = void*;

constexpr Return kSuccess = 0;
constexpr Return kNotSupported = 3;
constexpr Return kTimeout = 10;
constexpr Return kFunctionNotFound = 13;  // also ours, for a symbol this driver lacks

constexpr unsigned kMaxNvLinks = 18;  // NVML_NVLINK_MAX_LINKS (Hopper)
constexpr unsigned kTextSize = 96;    // NVML_DEVICE_NAME_V2/UUID_V2_BUFFER_SIZE, > the driver's 80

struct PciInfo {  // nvmlPciInfo_t (v3)
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
};

struct Memory {  // nvmlMemory_t
  unsigned long long total, free, used;
};

struct Bar1Memory {  // nvmlBAR1Memory_t
  unsigned long long total, free, used;
};

struct Utilization {  // nvmlUtilization_t
  unsigned gpu, memory;
};

union Value {  // nvmlValue_t
  double d;
  unsigned ui;
  unsigned long ul;
  unsigned long long ull;
  long long sll;
  int si;
  unsigned short us;
};

struct FieldValue {  // nvmlFieldValue_t
  unsigned field_id;
  unsigned scope_id;  // for NVLink fields: the link
  long long timestamp;
  long long latency_us;
  int value_type;
  Return result;
  Value value;
};

struct EventData {  // nvmlEventData_t
  Device device;
  unsigned long long type;
  unsigned long long data;  // for an Xid event: the Xid
  unsigned gpu_instance, compute_instance;
};

struct GpuFabricInfo {  // nvmlGpuFabricInfo_t
  unsigned char cluster_uuid[16];
  Return status;
  unsigned clique_id;
  unsigned char state;
};

// The entry points pod-init calls, by their exported names' versions.
struct Api {
  Return (*init)();
  Return (*shutdown)();
  const char* (*error_string)(Return);
  Return (*driver_version)(char*, unsigned);
  Return (*device_count)(unsigned*);
  Return (*handle_by_index)(unsigned, Device*);
  Return (*handle_by_bus_id)(const char*, Device*);
  Return (*device_index)(Device, unsigned*);
  Return (*pci_info)(Device, PciInfo*);
  Return (*name)(Device, char*, unsigned);
  Return (*uuid)(Device, char*, unsigned);
  Return (*compute_capability)(Device, int*, int*);
  Return (*memory_info)(Device, Memory*);
  Return (*bar1_memory_info)(Device, Bar1Memory*);
  Return (*pcie_generation)(Device, unsigned*);
  Return (*pcie_max_generation)(Device, unsigned*);
  Return (*pcie_width)(Device, unsigned*);
  Return (*pcie_max_width)(Device, unsigned*);
  Return (*pcie_throughput)(Device, int, unsigned*);
  Return (*utilization)(Device, Utilization*);
  Return (*temperature)(Device, int, unsigned*);
  Return (*field_values)(Device, int, FieldValue*);
  Return (*nvlink_state)(Device, unsigned, int*);
  Return (*nvlink_remote_pci)(Device, unsigned, PciInfo*);
  Return (*nvlink_remote_type)(Device, unsigned, unsigned*);
  Return (*p2p_status)(Device, Device, int, int*);
  Return (*common_ancestor)(Device, Device, int*);
  Return (*ecc_mode)(Device, int*, int*);
  Return (*total_ecc_errors)(Device, int, int, unsigned long long*);
  Return (*remapped_rows)(Device, unsigned*, unsigned*, unsigned*, unsigned*);
  Return (*get_persistence)(Device, int*);
  Return (*set_persistence)(Device, int);
  Return (*fabric_info)(Device, GpuFabricInfo*);
  Return (*event_set_create)(EventSet*);
  Return (*event_set_free)(EventSet);
  Return (*register_events)(Device, unsigned long long, EventSet);
  Return (*event_set_wait)(EventSet, EventData*, unsigned);
};

// What a query NVML refused says: "GPU 1: nvmlDeviceGetName: GPU is lost"
// ("nvmlDeviceGetCount_v2: ..." for a query of no one GPU: `gpu` -1).
std::string refusal(const std::string& call, int gpu, const std::string& text);

// A query NVML refused; what() is its refusal().
class Error : public std::runtime_error {
 public:
  Error(Return result, const std::string& call, int gpu, const std::string& text);
  Return result() const { return result_; }

 private:
  Return result_;
};

// One initialised NVML: loaded and nvmlInit'ed by open(), shut down by the
// destructor (NVML counts its inits, so several may coexist), never unloaded.
class Library {
 public:
  Library() = default;
  ~Library();
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;

  // Loads `path` (a name the loader searches for, or a file) and initialises
  // NVML: "" or what went wrong, in one line.
  std::string open(const char* path = "libnvidia-ml.so.1");
  bool is_open() const { return initialised_; }

  // Calls NVML's `entry` of the Api, or answers kFunctionNotFound where this
  // driver's NVML lacks it (an older one): each caller decides what that means.
  template <typename... Params, typename... Args>
  Return call(Return (*Api::*entry)(Params...), Args... args) const {
    auto function = api_.*entry;
    return function == nullptr ? kFunctionNotFound : function(args...);
  }
  // NVML's text for `result` ("Not Supported", "GPU is lost").
  std::string error(Return result) const;

 private:
  Api api_{};
  bool initialised_ = false;
};

}  // namespace pod_init::nvml
