#include "init/boot_state.hpp"

#include "common/atomic_file.hpp"
#include "common/error.hpp"
#include "common/json_writer.hpp"
#include "common/sysfs.hpp"
#include "topology/report.hpp"

namespace pod_init {

std::string read_boot_id(const std::string& proc_root) {
  std::string text;
  if (sysfs::read_text(proc_root + "/sys/kernel/random/boot_id", &text) < 0) return "";
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

void write_boot_state(const std::string& dir, const std::string& boot_id, const Topology& topo,
                      const NcclConfig* nccl, const std::vector<BootPhase>& timeline) {
  int rc = make_directories(dir);
  if (rc < 0) throw SysError(-rc, "mkdir", dir);
  std::string topology_path = dir + "/topology.json";
  rc = write_file_atomically(topology_path, topology_json(topo));
  if (rc < 0) throw SysError(-rc, "write", topology_path);
  if (nccl != nullptr) write_nccl_files(*nccl);

  JsonWriter json;
  json.begin_object();
  json.key("boot_id").value(boot_id);
  json.key("sysfs_root").value(topo.sysfs_root);
  json.key("topology").value("topology.json");
  json.key("nccl");
  if (nccl == nullptr) {
    json.null();
  } else {
    json.begin_object().key("dir").value(nccl->out_dir).key("env").begin_object();
    for (const EnvSetting& setting : nccl->env) json.key(setting.key).value(setting.value);
    json.end_object().end_object();
  }
  json.key("timeline").begin_array();
  for (const BootPhase& phase : timeline) {
    json.begin_object()
        .key("phase")
        .value(phase.phase)
        .key("start_s")
        .value(phase.start_s)
        .key("seconds")
        .value(phase.seconds)
        .end_object();
  }
  json.end_array().end_object();
  std::string manifest = dir + "/node.json";
  rc = write_file_atomically(manifest, json.str() + "\n");
  if (rc < 0) throw SysError(-rc, "write", manifest);
}

}  // namespace pod_init
