"""`pod-init nccl` / `pyinit nccl`: rings, NCCL XML files, env file, host lists
and bad input, on fixture trees; NVML through the recorded 2xH200 answers."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import sysfs_fixtures
from conftest import run

import pyinit.cli
from pyinit.nvml import FakeNvml, read_nvml
from pyinit.topology import scan

GOLDEN = Path(__file__).parent / "golden"
H200X2_NVML = json.loads((Path(__file__).parent / "data/h200x2-nvml.json").read_text())
# Sapphire Rapids, as /proc/cpuinfo shows it: fixed so the files do not depend on this machine.
CPUINFO = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n\n"


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    root.mkdir()
    (root / "cpuinfo").write_text(CPUINFO)
    return root


@pytest.fixture
def fake_nvml(monkeypatch):
    monkeypatch.setattr(pyinit.cli, "nvml_backend", FakeNvml(H200X2_NVML))


def nccl(tool: Path, sysfs: Path, out: Path, proc: Path, *extra: str, env=None):
    args = [tool, "nccl", "--sysfs-root", sysfs, "--proc-root", proc, "--out", out, *extra]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    return run(args, env={**clean, **(env or {})})


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("POD_INIT_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with POD_INIT_UPDATE_GOLDEN=1 once"
    assert text == path.read_text(), f"{name} differs from the golden file"


def round_trips(text: str) -> ET.Element:
    """Parses, writes back and parses again: the same tree both times."""
    tree = ET.fromstring(text)
    again = ET.fromstring(ET.tostring(tree, encoding="unicode"))
    assert ET.canonicalize(ET.tostring(tree)) == ET.canonicalize(ET.tostring(again))
    return tree


def ring_cost(order: list[int], level) -> tuple[int, int, int]:
    hops = [level(order[i], order[(i + 1) % len(order)]) for i in range(len(order))]
    return hops.count("SYS"), hops.count("NODE"), hops.count("PHB")


def test_8gpu_rings_cross_sockets_twice_and_host_bridges_least(
    pod_init_bin, eightgpu_tree, tmp_path, proc_root
):
    proc = nccl(pod_init_bin, eightgpu_tree, tmp_path, proc_root)
    assert proc.returncode == 0, proc.stderr
    graph = round_trips((tmp_path / "nccl-graph.xml").read_text())
    ring = graph.find("graph")
    assert ring.get("pattern") == "4" and ring.get("id") == "0"
    channels = ring.findall("channel")
    assert len(channels) == int(ring.get("nchannels")) >= 1

    topo = scan(eightgpu_tree, probe_bar0=False)
    gpus = [d.bdf for d in topo.devices if d.kind == "gpu"]

    def level(a: int, b: int) -> str:
        return topo.matrix.level(gpus[a], gpus[b])

    # The best any ring can do among those with the widest slowest hop (GPU4 is x8,
    # so every ring has it): brute force over all orders.
    best = min(ring_cost([0, *p], level) for p in itertools.permutations(range(1, 8)))
    assert best[:2] == (2, 2)
    for channel in channels:
        order = [int(g.get("dev")) for g in channel.findall("gpu")]
        assert sorted(order) == list(range(8))  # every GPU once
        assert ring_cost(order, level) == best
    assert "SYS 2, NODE 2, PHB 0" in proc.stdout
    assert "GPU0 -" in proc.stdout and "(no NVML data" in proc.stdout


def test_8gpu_topology_file_nests_the_real_tree(pod_init_bin, eightgpu_tree, tmp_path, proc_root):
    assert nccl(pod_init_bin, eightgpu_tree, tmp_path, proc_root).returncode == 0
    text = (tmp_path / "nccl-topo.xml").read_text()
    check_golden("8gpu/nccl-topo.xml", text)
    check_golden("8gpu/nccl-graph.xml", (tmp_path / "nccl-graph.xml").read_text())
    system = round_trips(text)
    assert system.tag == "system" and system.get("version") == "1"
    cpus = system.findall("cpu")
    assert [c.get("numaid") for c in cpus] == ["0", "1"]
    assert {c.get("vendor") for c in cpus} == {"GenuineIntel"}
    assert cpus[0].get("affinity").endswith(",00ffffff,ffffffff")  # CPUs 0-55, 112-167
    parents = {child: parent for parent in system.iter() for child in parent}

    def gpu_pci(bdf: str) -> ET.Element:
        return next(p for p in system.iter("pci") if p.get("busid") == bdf)

    # GPU2 sits below two switch levels, as in sysfs; the x8 GPU says so.
    pci = gpu_pci("0000:1c:00.0")
    assert [parents[pci].get("busid"), parents[parents[pci]].get("busid")] == [
        "0000:1a:00.0",
        "0000:18:00.0",
    ]
    assert parents[parents[parents[pci]]] is cpus[0]
    assert gpu_pci("0000:83:00.0").get("link_width") == "8"
    gpus = sorted((int(g.get("dev")), parents[g].get("busid")) for g in system.iter("gpu"))
    assert [bdf for _, bdf in gpus] == sorted(bdf for _, bdf in gpus)  # dev is PCI order
    for switch in (p for p in system.iter("pci") if p.get("class") == "0x060400"):
        assert len(switch) > 0 and switch.get("link_speed") == "32.0 GT/s PCIe"
    nets = [n.get("name") for n in system.iter("net")]
    assert nets == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    env = (tmp_path / "nccl.env").read_text()
    assert f"NCCL_TOPO_FILE={tmp_path}/nccl-topo.xml\n" in env
    assert "NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3\n" in env
    assert "NCCL_GRAPH_FILE" not in env
    assert not (tmp_path / "hosts").exists()


def test_force_rings_points_nccl_at_the_graph(pod_init_bin, eightgpu_tree, tmp_path, proc_root):
    extra = ["--force-rings", "--channels", "3"]
    proc = nccl(pod_init_bin, eightgpu_tree, tmp_path, proc_root, *extra)
    assert proc.returncode == 0, proc.stderr
    assert f"NCCL_GRAPH_FILE={tmp_path}/nccl-graph.xml\n" in (tmp_path / "nccl.env").read_text()
    graph = ET.parse(tmp_path / "nccl-graph.xml").getroot().find("graph")
    assert graph.get("nchannels") == "3" and len(graph) == 3
    assert graph.get("typeintra") == "SYS"


def test_nvml_merge_gives_nvlink_rings_and_matrix(
    fake_nvml, h200x2_tree, tmp_path, proc_root, capsys
):
    status = pyinit.cli.main(
        ["nccl", "--sysfs-root", str(h200x2_tree), "--proc-root", str(proc_root),
         "--out", str(tmp_path)]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert status == 0
    assert "GPU0 -NV18-> GPU1 -NV18-> GPU0" in out
    assert "slowest hop 370.8 GB/s" in out  # 18 links x NCCL's 20.6 GB/s for sm90
    topo_xml = (tmp_path / "nccl-topo.xml").read_text()
    check_golden("h200x2-nvml/nccl-topo.xml", topo_xml)
    check_golden("h200x2-nvml/nccl-graph.xml", (tmp_path / "nccl-graph.xml").read_text())
    gpus = list(round_trips(topo_xml).iter("gpu"))
    assert [g.get("sm") for g in gpus] == ["90", "90"]
    links = [(n.get("target"), n.get("count"), n.get("tclass")) for n in gpus[0]]
    assert links == [("fffffff:ff:ff.0", "18", "0x068000")]  # NCCL's NVSwitch notation
    graph = ET.parse(tmp_path / "nccl-graph.xml").getroot().find("graph")
    assert graph.get("typeintra") == "NVL" and graph.get("nchannels") == "12"

    assert pyinit.cli.main(["topo", "--sysfs-root", str(h200x2_tree), "--no-bar0"]) == 0
    text = capsys.readouterr().out
    assert "GPU0  X     NV18" in text
    assert "GPU0-GPU1  OK/OK/OK/OK  PHB" in text  # P2P and NVML's common ancestor
    view = read_nvml(FakeNvml(H200X2_NVML))
    topo = scan(h200x2_tree, probe_bar0=False, nvml=view)
    assert topo.matrix.cell("0000:00:06.0", "0000:00:07.0") == "NV18"
    assert topo.matrix.level("0000:00:06.0", "0000:00:07.0") == view.pairs[0].common_ancestor


def test_without_nvml_it_says_so(monkeypatch, h200x2_tree, tmp_path, proc_root, capsys):
    # A backend that finds no GPU stands for a machine without a driver.
    monkeypatch.setattr(pyinit.cli, "nvml_backend", FakeNvml({"gpus": []}))
    argv = ["nccl", "--sysfs-root", str(h200x2_tree), "--proc-root", str(proc_root)]
    assert pyinit.cli.main([*argv, "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "NVML unavailable (no GPU in the recorded NVML data); working from sysfs alone" in err
    assert "(no NVML data" in out and "-PHB->" in out


def test_hints_regroup_a_flat_vm(pod_init_bin, h200x2_tree, tmp_path, proc_root):
    hints = tmp_path / "hints"
    hints.write_text(
        "# the 2xH200 VM as the host has it\n"
        "numa 0 0000:00:06.0 0000:00:07.0 0000:00:03.0\n"
        "switch 0000:00:06.0 0000:00:07.0\n"
    )
    out = tmp_path / "out"
    proc = nccl(pod_init_bin, h200x2_tree, out, proc_root, "--hints", hints)
    assert proc.returncode == 0, proc.stderr
    assert "GPU0 -PIX-> GPU1 -PIX-> GPU0" in proc.stdout
    text = (out / "nccl-topo.xml").read_text()
    check_golden("h200x2-hints/nccl-topo.xml", text)
    cpu = round_trips(text).find("cpu")
    assert cpu.get("numaid") == "0" and cpu.get("affinity") == "ffffffff"
    switch = cpu.find("pci")
    assert switch.get("busid") == "ffff:ff:01.0" and switch.get("class") == "0x060400"
    assert [p.get("busid") for p in switch] == ["0000:00:06.0", "0000:00:07.0"]


def own_address() -> str:
    """The address this machine sends from, off lo (a UDP connect sends nothing)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError:
            pytest.skip("this machine has no route off lo")
        return probe.getsockname()[0]


def test_hostfile_writes_hosts_and_rail_aligned_channels(
    pod_init_bin, eightgpu_tree, tmp_path, proc_root
):
    me = own_address()
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"# two nodes\n{me} slots=8\n192.0.2.77 slots=8\n")
    out = tmp_path / "out"
    proc = nccl(pod_init_bin, eightgpu_tree, out, proc_root, "--hostfile", hostfile)
    assert proc.returncode == 0, proc.stderr
    assert (out / "hosts").read_text() == f"{me} node-0\n192.0.2.77 node-1\n"
    assert f"this is node-0, master node-0 {me}" in proc.stdout
    topo = ET.parse(out / "nccl-topo.xml").getroot()
    assert [int(g.get("rank")) for g in topo.iter("gpu")] == list(range(8))
    graph = ET.parse(out / "nccl-graph.xml").getroot().find("graph")
    nets = [n.get("name") for n in topo.iter("net")]
    matrix = scan(eightgpu_tree, probe_bar0=False).matrix
    gpus, nics = matrix.devices[:8], matrix.devices[8:12]
    for channel in graph:
        first, *middle, last = list(channel)
        assert first.tag == last.tag == "net" and first.get("dev") == last.get("dev")
        nic = nics[int(first.get("dev"))]
        ends = [int(middle[0].get("dev")), int(middle[-1].get("dev"))]
        # Rails: both ends of the ring sit next to the channel's NIC where one is near.
        assert {matrix.level(gpus[g], nic) for g in ends} <= {"PIX", "PXB"}, (ends, nic)
    assert {n.get("dev") for c in graph for n in c.iter("net")} <= set(map(str, range(len(nets))))
    assert graph.get("typeinter") in {"PIX", "PXB"}


def cluster_hostfile(folder: Path, nodes: int) -> Path:
    path = folder / f"hosts-{nodes}"
    path.write_text("".join(f"10.{i // 4000}.{i // 250 % 16}.{i % 250 + 1} slots=8\n"
                            for i in range(nodes)))  # fmt: skip
    return path


@pytest.mark.parametrize("count", [64, 512])
def test_every_node_of_a_large_cluster_plans_the_same_rings(eightgpu_tree, tmp_path, count):
    """Each node's files, as that node would write them: one ring order, every
    rank exactly once, every NIC rail used as often as the others, and the same
    bytes when planned again."""
    from pyinit.nccl import configure, load_nodes

    hostfile = cluster_hostfile(tmp_path, count)
    topology = scan(eightgpu_tree, probe_bar0=False)
    ranks, graphs, hosts = [], set(), set()
    for node in range(count):
        config = configure(topology=topology, nodes=load_nodes(str(hostfile), node=node),
                           out_dir=str(tmp_path / "out"), channels=8, environment={})  # fmt: skip
        assert config.node_rank == node
        files = config.files
        ranks += [int(g.get("rank")) for g in ET.fromstring(files["nccl-topo.xml"]).iter("gpu")]
        graphs.add(files["nccl-graph.xml"])
        hosts.add(files["hosts"])
        # Another machine's interfaces are not here: no socket interface is guessed for it.
        assert "NCCL_SOCKET_IFNAME" not in config.env
    assert sorted(ranks) == list(range(8 * count))
    assert len(graphs) == 1 and len(hosts) == 1
    assert (
        next(iter(hosts)).splitlines()[-1] == f"10.{(count - 1) // 4000}."
        f"{(count - 1) // 250 % 16}.{(count - 1) % 250 + 1} node-{count - 1}"
    )
    graph = ET.fromstring(next(iter(graphs))).find("graph")
    rails = [channel[0].get("dev") for channel in graph]
    uses = {rail: rails.count(rail) for rail in rails}
    assert len(uses) == 4 and len(set(uses.values())) == 1, uses
    # Every channel is the one ring, cut where its rail enters and leaves.
    ring = list(config.ring)
    rotations = {tuple(ring[i:] + ring[:i]) for i in range(len(ring))}
    rotations |= {tuple(reversed(r)) for r in rotations}
    for channel in graph:
        assert tuple(int(g.get("dev")) for g in channel.iter("gpu")) in rotations
    again = configure(topology=topology, nodes=load_nodes(str(hostfile), node=count - 1),
                      out_dir=str(tmp_path / "out"), channels=8, environment={})  # fmt: skip
    assert again.files["nccl-graph.xml"] == next(iter(graphs))


def test_the_executables_plan_another_node(pod_init_bin, pyinit_bin, eightgpu_tree, tmp_path,
                                          proc_root):  # fmt: skip
    hostfile = cluster_hostfile(tmp_path, 64)
    outputs = []
    for tool in (pod_init_bin, pyinit_bin):
        out = tmp_path / tool.name
        extra = ["--no-nvml"] if tool == pyinit_bin else []
        done = nccl(tool, eightgpu_tree, out, proc_root, "--hostfile", hostfile, "--node", "63",
                    "--socket-ifname", "ens1f0", *extra)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "this is node-63, master node-0 10.0.0.1" in done.stdout
        assert "NCCL_SOCKET_IFNAME==ens1f0" in (out / "nccl.env").read_text()  # "=": exactly
        outputs.append({p.name: p.read_text() for p in out.iterdir()})
    assert outputs[0]["nccl-graph.xml"] == outputs[1]["nccl-graph.xml"]
    assert outputs[0]["hosts"] == outputs[1]["hosts"]


def test_a_node_s_plan_imports_no_view_and_no_resolver(eightgpu_tree, tmp_path, proc_root):
    """`pyinit nccl --node K` at every node's start: the plan is the core's,
    and the dataclasses over the scan (with `dataclasses` and `inspect`, and
    their building for every device) took 16 ms of a 62 ms plan; `socket`
    (for host names, which this hostfile has none of) and argparse's `shutil`
    2-3 ms each. Counted from what the interpreter had before: an environment's
    `.pth` files may import some of them at every start (a GPU node's did
    `shutil`)."""
    hostfile = cluster_hostfile(tmp_path, 64)
    code = ("import sys\n"
            "before = set(sys.modules)\n"
            "import pyinit.cli as c\n"
            "status = c.main(sys.argv[1:])\n"
            "views = ('dataclasses', 'pyinit.topology', 'shutil', 'socket')\n"
            "print(status, sorted(set(views) & set(sys.modules) - before))")  # fmt: skip
    argv = ["nccl", "--sysfs-root", eightgpu_tree, "--proc-root", proc_root, "--out",
            tmp_path / "out", "--hostfile", hostfile, "--node", "63", "--no-nvml"]  # fmt: skip
    done = run([sys.executable, "-c", code, *argv])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "0 []", done.stdout[-500:]
    assert (tmp_path / "out" / "nccl-topo.xml").is_file()


HINTS, HOSTS = ["--hints", "{hints}"], ["--hostfile", "{hosts}"]
BAD_INPUT = [
    # (files to write, extra arguments, what stderr must say)
    ({"hints": "numa 0 0000:00:06.0\nrack 7\n"}, HINTS, "{hints}:2: unknown keyword"),
    ({"hints": "switch 0000:00:0a.0\n"}, HINTS, "{hints}:1: 0000:00:0a.0: no such"),
    ({"hosts": "10.0.0.1\n10.0.0.2\n10.0.0.1\n"}, HOSTS, "{hosts}:3: duplicate host 10.0.0.1"),
    ({"hosts": "gpu-node-1\n"}, HOSTS, "{hosts}:1: 'gpu-node-1' is not an IP address"),
    ({"hosts": "192.0.2.200\n192.0.2.201\n"}, HOSTS, "{hosts}: none of this node's addresses"),
    ({}, ["--socket-ifname", "nosuch0"], "no network interface named 'nosuch0'"),
    ({}, ["--channels", "0"], "--channels"),
    (
        {"hosts": "10.0.0.1\n10.0.0.2\n"},
        [*HOSTS, "--node", "2"],
        "{hosts}: --node 2: the hostfile has 2 nodes (0 to 1)",
    ),
    ({}, ["--node", "1"], "--node needs --hostfile"),
]


@pytest.mark.parametrize("files, extra, message", BAD_INPUT)
@pytest.mark.parametrize("tool", ["pod-init", "pyinit"])
def test_bad_input_exits_2_and_writes_nothing(
    tool, files, extra, message, pod_init_bin, pyinit_bin, h200x2_tree, tmp_path, proc_root
):
    names = {name: tmp_path / name for name in files}
    for name, text in files.items():
        names[name].write_text(text)
    fill = {**{k: str(v) for k, v in names.items()}, "tmp": str(tmp_path)}
    out = tmp_path / "out"
    out.mkdir()
    (out / "nccl.env").write_text("NCCL_TOPO_FILE=/previous/run\n")
    binary = pod_init_bin if tool == "pod-init" else pyinit_bin
    args = [a.format(**fill) for a in extra]
    # pyinit only: sysfs alone and no name lookups, as the executable always works.
    own = ["--no-nvml", "--no-dns"] if tool == "pyinit" else []
    proc = nccl(binary, h200x2_tree, out, proc_root, *own, *args)
    assert proc.returncode == 2, proc.stderr
    assert message.format(**fill) in proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["nccl.env"]  # no new file, no temporary
    assert (out / "nccl.env").read_text() == "NCCL_TOPO_FILE=/previous/run\n"


@pytest.mark.parametrize("tool", ["pod-init", "pyinit"])
def test_sysfs_without_gpus_is_bad_input(tool, pod_init_bin, pyinit_bin, tmp_path, proc_root):
    tree = sysfs_fixtures.SysfsTree(tmp_path / "sys")
    tree.device("0000:00:03.0", "pci0000:00", 0x1AF4, 0x1041, 0x020000, port_type=None)
    binary = pod_init_bin if tool == "pod-init" else pyinit_bin
    proc = nccl(binary, tree.root, tmp_path / "out", proc_root)
    assert proc.returncode == 2
    assert f"{tree.root}: no GPU among the PCI devices" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_environment_values_win_and_are_reported(pod_init_bin, eightgpu_tree, tmp_path, proc_root):
    env = {"NCCL_SOCKET_IFNAME": "=ib0", "NCCL_IB_HCA": "=mlx5_0,mlx5_1,mlx5_2,mlx5_3"}
    proc = nccl(pod_init_bin, eightgpu_tree, tmp_path, proc_root, env=env)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "nccl.env").read_text()
    assert "# NCCL_SOCKET_IFNAME kept from the environment, not pod-init's choice\n" in text
    assert "NCCL_SOCKET_IFNAME==ib0\n" in text
    assert "NCCL_SOCKET_IFNAME==ib0  (kept from the environment; pod-init chose =" in proc.stdout
    assert "NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3  (also set in the environment)" in proc.stdout
    # /etc/nccl.conf syntax: every line without '=' is ignored by NCCL; comments have none.
    assert all("=" not in line for line in text.splitlines() if line.startswith("#"))


def test_a_folder_and_variables_that_are_not_utf8(pyinit_bin, h200x2_tree, tmp_path, proc_root):
    """A variable that is not UTF-8 anywhere in the environment, and such an
    output folder: the files are written and the summary shows the bytes as
    \\xNN, where each ended pyinit nccl with a bug's traceback (pyinit run
    builds the same configuration on every node with GPUs)."""
    out = Path(os.fsdecode(bytes(tmp_path) + b"/nccl-\xff"))
    proc = nccl(pyinit_bin, h200x2_tree, out, proc_root, env={"UNRELATED": "caf\udce9"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    topology_file = b"NCCL_TOPO_FILE='" + bytes(out) + b"/nccl-topo.xml'\n"  # the folder's bytes
    assert topology_file in (out / "nccl.env").read_bytes()
    assert f"{tmp_path}/nccl-\\xff/" in proc.stdout


def test_output_folder_that_is_a_file(pod_init_bin, eightgpu_tree, tmp_path, proc_root):
    blocker = tmp_path / "out"
    blocker.write_text("")
    proc = nccl(pod_init_bin, eightgpu_tree, blocker, proc_root)
    assert proc.returncode == 1
    assert f"{blocker}: mkdir: Not a directory" in proc.stderr


# Network namespaces: the socket interface is the one the kernel routes to the master by.

NETNS = "podinit-test"


@pytest.fixture
def netns():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2 (CI runs as root)")
    subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)
    script = f"""
        ip netns add {NETNS}
        ip netns exec {NETNS} ip link set lo up
        ip netns exec {NETNS} ip link add rail0 type veth peer name rail0-peer
        ip netns exec {NETNS} ip addr add 10.77.0.1/24 dev rail0
        ip netns exec {NETNS} ip link set rail0 up
        ip netns exec {NETNS} ip link set rail0-peer up
        ip netns exec {NETNS} ip link add podbr0 type bridge
        ip netns exec {NETNS} ip addr add 10.88.0.1/24 dev podbr0
        ip netns exec {NETNS} ip link set podbr0 up
    """
    subprocess.run(["sh", "-ec", script], check=True, capture_output=True)
    yield ["ip", "netns", "exec", NETNS]
    subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)


@pytest.mark.root
def test_socket_interface_reaches_the_master(
    netns, pod_init_bin, eightgpu_tree, tmp_path, proc_root
):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("10.77.0.2\n10.77.0.1\n")
    out = tmp_path / "out"
    proc = run([*netns, pod_init_bin, "nccl", "--sysfs-root", eightgpu_tree, "--proc-root",
                proc_root, "--out", out, "--hostfile", hostfile])  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "NCCL_SOCKET_IFNAME==rail0\n" in (out / "nccl.env").read_text()
    assert "carries 10.77.0.1 -> master 10.77.0.2" in proc.stdout
    assert "this is node-1" in proc.stdout
    assert (out / "hosts").read_text() == "10.77.0.2 node-0\n10.77.0.1 node-1\n"


@pytest.mark.root
@pytest.mark.parametrize(
    "master, why",
    [
        ("127.0.0.2", "through lo, the loopback"),
        ("10.88.0.2", "through podbr0, a container bridge"),
    ],
)
def test_master_behind_loopback_or_bridge_is_refused(
    master, why, netns, pod_init_bin, eightgpu_tree, tmp_path, proc_root
):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"{master}\n10.77.0.1\n")
    proc = run([*netns, pod_init_bin, "nccl", "--sysfs-root", eightgpu_tree, "--proc-root",
                proc_root, "--out", tmp_path / "out", "--hostfile", hostfile])  # fmt: skip
    assert proc.returncode == 2
    assert f"{hostfile}:1: the master {master} is reached {why}" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_pyinit_resolves_names_once_unless_no_dns(pyinit_bin, h200x2_tree, tmp_path, proc_root):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# one node, by name\nlocalhost slots=2\n")
    out = tmp_path / "out"
    proc = nccl(pyinit_bin, h200x2_tree, out, proc_root, "--no-nvml", "--hostfile", hostfile)
    assert proc.returncode == 0, proc.stderr
    assert (out / "hosts").read_text() in {"127.0.0.1 node-0\n", "::1 node-0\n"}

    proc = nccl(pyinit_bin, h200x2_tree, out, proc_root, "--no-dns", "--hostfile", hostfile)
    assert proc.returncode == 2
    assert f"{hostfile}:2: 'localhost' is not an IP address (DNS is not used)" in proc.stderr


def test_unresolvable_name_names_the_line(monkeypatch, h200x2_tree, tmp_path, proc_root):
    import socket

    from pyinit.nccl import configure

    def no_dns(host, *args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("10.0.0.1\ngpu[07-08]  # rack 2\n")
    with pytest.raises(ValueError, match=rf"^{hostfile}:2: cannot resolve 'gpu07': Name or"):
        configure(h200x2_tree, hostfile=str(hostfile), out_dir=str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
