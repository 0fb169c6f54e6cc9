"""Multi-node jobs of real containers on one podman network, each reached by
its DNS name (aardvark-dns: container names and network aliases) as pods
are on Kubernetes, with the environment Kubeflow injects and the command
lines of examples/k8s:

- the static PyTorchJob (a master and a worker pod; pytorchjob-static.yaml),
- the elastic PyTorchJob whose worker-0 hosts the c10d rendezvous
  (pytorchjob-elastic.yaml) and the one against a gpulaunch-rdzv container
  (pytorchjob-elastic-server.yaml, rdzv-server.yaml),
- Kubeflow Trainer v2's TrainJob (trainjob.yaml),

and one container killed (`podman kill`) mid-training: an elastic job
re-forms and finishes with the parameters an uninterrupted run gives, a
static one ends with a retryable exit code; nothing is left running.

The manifests give the job names, ports, elastic policy, launcher options
and environment; the operators' rules give the injected variables (Kubeflow
training-operator release-1.9: pkg/controller.v1/pytorch/envvar.go and
elastic.go; Kubeflow Trainer v2: pkg/runtime/framework/plugins/torch/torch.go).
Pod and process counts are scaled down to fit 2 cores. Each test has its own
network, removed with every container it started, even when the test fails. A machine where the engine cannot run fails here
with the reason (it does not skip)."""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parents[1] / "examples" / "k8s"
sys.path.insert(0, str(HERE))
import multinode_job  # noqa: E402

IMAGE = os.environ.get("GPULAUNCH_TEST_IMAGE", "")
ENGINE = ["podman"]
RUN_OPTS = ["--runtime", "runc", "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096",
            "--shm-size", "1100m"]
PROGRAM = ["/job/multinode_job.py"]  # in place of the examples' train_llm.py and its arguments
STEPS, STEP_S, EVERY = 120, 0.02, 10  # steps, seconds of sleep per step, checkpoint every
KILL_AFTER = EVERY * 3 + 2  # a step line past the third checkpoint: training has run a while
# A killed container closes its connections: the rendezvous learns it at once,
# not after the heartbeat timeout (5 s); 6 s is the fault matrix's bound for
# the survivors being told (docs/reliability.md).
RECOVERY_S = 6.0
RETRYABLE = range(128, 256)  # restartPolicy: ExitCode retries these (training-operator train_util.go)


@pytest.fixture(autouse=True)
def need_image() -> None:
    if not IMAGE:
        pytest.fail("GPULAUNCH_TEST_IMAGE is not set: scripts/test.sh builds the image with "
                    "scripts/container_image.sh")


def podman(*args: str, timeout: float = 60, check: bool = False) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(ENGINE + list(args), capture_output=True, text=True, timeout=timeout)
    if check:
        assert p.returncode == 0, f"podman {' '.join(args)}: {p.stdout}{p.stderr}"
    return p


def manifest(file: str, kind: str) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all((EXAMPLES / file).read_text()) if d and d["kind"] == kind]
    assert len(docs) == 1, f"{file}: expected one {kind}"
    doc: dict[str, Any] = docs[0]
    return doc


def pod_container(job: dict[str, Any], rtype: str = "Worker") -> dict[str, Any]:
    c: dict[str, Any] = job["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"]["containers"][0]
    return c


def launcher_options(command: list[str]) -> list[str]:
    """The options an example's command gives gpulaunch before its program."""
    assert command[0] == "gpulaunch", command
    prog = next(i for i, a in enumerate(command) if a.endswith(".py"))
    return command[1:prog]


def literal_env(container: dict[str, Any], **override: str) -> dict[str, str]:
    """The container's own env of literal values, overrides applied (scaled counts, secrets)."""
    env = {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}
    env.update(override)
    return env


class Cluster:
    """Containers of one job on a network of their own. A pod is a container
    whose host name and network alias are the pod's name (as a pod's host name
    and its DNS name are); its container name carries the test's id, so that
    a container left by a crashed run never clashes."""

    def __init__(self, ck: Path) -> None:
        self.id = uuid.uuid4().hex[:8]
        self.net = f"gplt-{self.id}"
        self.ck = ck
        ck.mkdir()

    def start(self) -> None:
        p = podman("network", "create", "--label", f"gpulaunch-test={self.id}", self.net)
        if p.returncode != 0:
            pytest.fail(f"podman cannot create a network here (netavark needs iptables, DNS needs "
                        f"aardvark-dns: scripts/deps.sh): {p.stdout}{p.stderr}")
        sub = podman("network", "inspect", self.net, "--format", "{{range .Subnets}}{{.Subnet}} {{end}}",
                     check=True).stdout.split()
        self.subnet = ipaddress.ip_network(sub[0])
        # The pod network's bridge keeps one MAC address, as a cluster's pod
        # gateway does. netavark 1.4 (Debian 12) leaves it to the kernel, which
        # gives a bridge the lowest MAC of its ports: it changes as containers
        # come and go, and a container whose ARP entry holds the old one loses
        # its gateway, and so aardvark-dns, for tens of seconds (fixed
        # upstream in 2023, containers/netavark#833). The bridge exists once a
        # container is on it: a pause container, as a pod has.
        podman("run", "-d", "--name", self.name("pause"), "--network", self.net, "--label",
               f"gpulaunch-test={self.id}", *RUN_OPTS, "--entrypoint", "sleep", IMAGE, "infinity",
               check=True)
        br = podman("network", "inspect", self.net, "--format", "{{.NetworkInterface}}",
                    check=True).stdout.strip()
        mac = Path(f"/sys/class/net/{br}/address").read_text().strip()
        p = subprocess.run(["ip", "link", "set", "dev", br, "address", mac], capture_output=True, text=True)
        if p.returncode != 0:
            pytest.fail(f"cannot pin the MAC address of {br}, the bridge of {self.net}: {p.stderr}")

    def name(self, pod: str) -> str:
        return f"{self.id}-{pod}"

    def ip(self, i: int) -> str:
        """The address of the job's pod number I (one given with --ip)."""
        return str(self.subnet[10 + i])

    def run(self, pod: str, args: list[str], env: dict[str, str], dns: tuple[str, ...] | None = None,
            fqdn: tuple[str, str] | None = None, entrypoint: str | None = None,
            mounts: tuple[str, ...] = ()) -> None:
        """Starts POD, known in DNS as DNS (default: its own name, as a pod
        with a Service of its name is). FQDN (name, address): the pod has a
        host name and a subdomain, and its /etc/hosts says so as the kubelet
        writes it (its address, its FQDN, its host name), so that its
        canonical name is the FQDN as on Kubernetes."""
        a = ["run", "-d", "--name", self.name(pod), "--hostname", pod, "--network", self.net,
             "--label", f"gpulaunch-test={self.id}", *RUN_OPTS, "-v", f"{HERE}:/job:ro",
             "-v", f"{self.ck}:/ck"]
        for al in (pod,) if dns is None else dns:
            a += ["--network-alias", al]
        if fqdn:
            hosts = self.ck.parent / f"hosts-{pod}"
            hosts.write_text(f"127.0.0.1\tlocalhost\n{fqdn[1]}\t{fqdn[0]}\t{pod}\n")
            a += ["--ip", fqdn[1], "--no-hosts", "-v", f"{hosts}:/etc/hosts:ro"]
        for m in mounts:
            a += ["-v", m]
        for k, v in env.items():
            a += ["-e", f"{k}={v}"]
        if entrypoint:
            a += ["--entrypoint", entrypoint]
        podman(*a, IMAGE, *args, check=True)

    def logs(self, pod: str) -> str:
        p = podman("logs", self.name(pod))
        return p.stdout + p.stderr

    def wait_for(self, pod: str, pattern: str, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if re.search(pattern, self.logs(pod), re.M):
                return
            time.sleep(0.2)
        raise AssertionError(f"{pod}: no /{pattern}/ within {timeout} s:\n{self.logs(pod)}")

    def kill(self, pod: str) -> float:
        t = time.time()
        podman("kill", self.name(pod), check=True)
        return t

    def wait(self, pod: str, timeout: float = 60) -> int:
        try:
            p = podman("wait", self.name(pod), timeout=timeout)
        except subprocess.TimeoutExpired:
            names = podman("ps", "-a", "--filter", f"label=gpulaunch-test={self.id}", "--format",
                           "{{.Names}}").stdout.split()
            logs = "\n".join(f"---- {n}\n{self.logs(n.split('-', 1)[1])}" for n in names)
            raise AssertionError(f"{pod} still running after {timeout} s:\n{logs}") from None
        assert p.returncode == 0, p.stderr
        return int(p.stdout.strip())

    def finished_at(self, pod: str) -> float:
        ns = podman("inspect", self.name(pod), "--format", "{{.State.FinishedAt.UnixNano}}", check=True)
        return int(ns.stdout.strip()) / 1e9

    def left_running(self) -> list[str]:
        """Running containers of this job (but its pause container), host
        processes naming it (conmon) and training processes anywhere."""
        deadline = time.time() + 5
        while True:
            ps = podman("ps", "--filter", f"label=gpulaunch-test={self.id}", "--format", "{{.Names}}")
            pause = self.name("pause")
            left = [n for n in ps.stdout.split() if n != pause]
            for d in Path("/proc").iterdir():
                if d.name.isdigit() and int(d.name) != os.getpid():
                    try:
                        cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    except OSError:
                        continue
                    if (self.id in cmd and pause not in cmd) or PROGRAM[0] in cmd:
                        left.append(f"pid {d.name}: {cmd.strip()}")
            if not left or time.time() > deadline:
                return left
            time.sleep(0.2)

    def close(self) -> None:
        ids = podman("ps", "-aq", "--filter", f"label=gpulaunch-test={self.id}").stdout.split()
        if ids:
            podman("rm", "-f", "-t", "0", *ids)
        podman("network", "rm", "-f", self.net)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path / "ck")
    try:
        c.start()
        yield c
    finally:
        c.close()


# ---- what the training program printed ----

def steps(out: str) -> list[tuple[int, int, int, float]]:
    """(step, rank, world, time) of every step line."""
    return [(int(s), int(r), int(w), float(t))
            for s, r, w, t in re.findall(r"^\S*step (\d+) rank (\d+) world (\d+) t ([\d.]+)$", out, re.M)]


def finals(*outs: str) -> dict[int, tuple[int, str]]:
    """rank -> (world, parameters' hash) of every rank that finished."""
    got: dict[int, tuple[int, str]] = {}
    for out in outs:
        for r, w, h in re.findall(r"done rank (\d+) world (\d+) params_sha256 ([0-9a-f]{64})", out):
            assert int(r) not in got, f"rank {r} finished twice:\n" + "\n".join(outs)
            got[int(r)] = (int(w), h)
    return got


def starts(out: str) -> list[tuple[int, int, str, int]]:
    """(rank, world, env text, step resumed from) of every worker start."""
    return [(int(r), int(w), e, int(s))
            for r, w, e, s in re.findall(r"start rank (\d+) world (\d+) node \S+ env (.*) from (\d+)", out)]


def check_all_trained(world: int, *outs: str) -> None:
    """Every rank of the final world ended with the parameters one
    uninterrupted rank computes (the update is the same at any world size)."""
    want = multinode_job.reference(STEPS)
    got = finals(*outs)
    assert sorted(got) == list(range(world)), "\n".join(outs)
    assert {g for g in got.values()} == {(world, want)}, f"{got} != {want}:\n" + "\n".join(outs)


def back_training(kill_t: float, world: int, *outs: str) -> float:
    """Seconds from the kill to the first step completed in a world of WORLD
    ranks by a worker that resumed from a checkpoint (a step line of the old
    round may come after the kill was issued)."""
    after = []
    for out in outs:
        resumed = False
        for line in out.splitlines():
            st = starts(line)
            if st:
                resumed = st[0][3] > 0
            elif resumed:
                after += [t for _, _, w, t in steps(line) if w == world]
    assert after, "no step after the kill:\n" + "\n".join(outs)
    return min(after) - kill_t


def report(line: str) -> None:
    print(line)  # shown with pytest -rP (the figures of docs/kubernetes.md)


# ---- the static PyTorchJob ----

def static_job(c: Cluster, nproc: int = 2, **extra: str) -> list[str]:
    """pytorchjob-static.yaml with 1 master + 1 worker pod of NPROC workers and
    the operator's variables for a job with a Master replica: MASTER_ADDR,
    MASTER_PORT, RANK (the pod's node rank), WORLD_SIZE (pods x nprocPerNode,
    or the pod count) and PET_*; EXTRA: more of the pod's own variables."""
    job = manifest("pytorchjob-static.yaml", "PyTorchJob")
    name = job["metadata"]["name"]
    spec = job["spec"]["pytorchReplicaSpecs"]
    pods = [f"{name}-master-0", f"{name}-worker-0"]
    port = next(p["containerPort"] for p in pod_container(job, "Master")["ports"]
                if p["name"] == "pytorchjob-port")
    nproc_spec = job["spec"].get("nprocPerNode")
    for rank, (pod, rtype) in enumerate(zip(pods, ["Master", "Worker"])):
        cont = pod_container(job, rtype)
        assert spec[rtype]["restartPolicy"] == "ExitCode"
        env = literal_env(cont, PET_NPROC_PER_NODE=str(nproc))
        env.update({
            "PYTHONUNBUFFERED": "1",
            "MASTER_ADDR": pods[0], "PET_MASTER_ADDR": pods[0],
            "MASTER_PORT": str(port), "PET_MASTER_PORT": str(port),
            "RANK": str(rank), "PET_NODE_RANK": str(rank),
            # pods x nprocPerNode when that is an integer, else the pod count
            "WORLD_SIZE": str(len(pods) * int(nproc_spec) if nproc_spec else len(pods)),
            "PET_NNODES": str(len(pods)),
        })
        env.update(extra)
        c.run(pod, [*launcher_options(cont["command"]), *PROGRAM, str(STEPS), "/ck", str(STEP_S),
                    str(EVERY)], env)
    return pods


def test_static_pytorchjob_trains_by_dns_name(cluster: Cluster) -> None:
    t0 = time.time()
    master, worker = static_job(cluster)
    codes = [cluster.wait(p) for p in (master, worker)]
    took = time.time() - t0
    mo, wo = cluster.logs(master), cluster.logs(worker)
    assert codes == [0, 0], mo + wo
    check_all_trained(4, mo, wo)
    # the node-level RANK=1 and WORLD_SIZE=2 the pod was given are the launcher's
    # input; its workers get their own (torchrun's contract)
    assert sorted((r, e) for r, _, e, _ in starts(wo)) == [
        (2, "RANK=2 GROUP_RANK=1 WORLD_SIZE=4"), (3, "RANK=3 GROUP_RANK=1 WORLD_SIZE=4")], wo
    assert f"master {master}:" in wo, wo
    assert not cluster.left_running()
    report(f"static PyTorchJob, 2 pods x 2 workers by DNS name: {STEPS} steps, {took:.1f} s")


@pytest.mark.parametrize("victim", ["worker-0", "master-0"])
def test_static_pytorchjob_node_killed_ends_retryable(cluster: Cluster, victim: str) -> None:
    """A static job cannot go on without a node: the survivor stops its
    workers and exits with a code restartPolicy: ExitCode retries (200: the
    round ended, no --max-restarts left), so the operator restarts the job's
    pods and it resumes from its checkpoint. Not 1-127, which would fail the
    PyTorchJob for good."""
    pods = static_job(cluster)
    killed = next(p for p in pods if p.endswith(victim))
    survivor = next(p for p in pods if p != killed)
    cluster.wait_for(survivor, rf"^\S*step {KILL_AFTER} ")
    t = cluster.kill(killed)
    code = cluster.wait(survivor)
    gone = cluster.finished_at(survivor) - t
    out = cluster.logs(survivor)
    assert cluster.wait(killed) == 137
    assert not cluster.left_running()
    report(f"static PyTorchJob, {victim} killed: the survivor exited {code} {gone:.2f} s after the kill")
    assert code in RETRYABLE, (
        f"the survivor of a lost {victim} exited {code}, which restartPolicy: ExitCode does not "
        f"retry: the operator would fail the PyTorchJob for good:\n{out}")
    assert code == 200, out
    assert "no restarts are left" in out, out
    assert gone < RECOVERY_S, out


def test_static_pytorchjob_with_restarts_waits_for_the_new_master(cluster: Cluster) -> None:
    """With a restart budget (PET_MAX_RESTARTS in the pod's env) the worker
    pod outlives the master pod: it restarts its workers and waits for the
    rendezvous at the master's name, where the operator's replacement pod
    (137 is retried; here the same container started again) hosts it again,
    and the job resumes from its checkpoint."""
    master, worker = static_job(cluster, PET_MAX_RESTARTS="3")
    cluster.wait_for(master, rf"^\S*step {KILL_AFTER} ")
    t = cluster.kill(master)
    assert cluster.wait(master) == 137
    podman("container", "cleanup", cluster.name(master))
    podman("start", cluster.name(master), check=True)
    codes = [cluster.wait(p) for p in (master, worker)]
    outs = [cluster.logs(p) for p in (master, worker)]
    assert codes == [0, 0], "\n".join(outs)
    again = back_training(t, 4, *outs)
    check_all_trained(4, *outs)
    assert not cluster.left_running()
    assert again < RECOVERY_S, "\n".join(outs)
    report(f"static PyTorchJob with PET_MAX_RESTARTS=3, master-0 killed and started again at once: "
           f"training again {again:.2f} s after the kill")


# ---- Kubeflow Trainer v2: a TrainJob ----

@pytest.mark.parametrize("local_addr", [True, False], ids=["example", "no-local-addr"])
def test_trainjob_trains_by_its_headless_service_name(cluster: Cluster, local_addr: bool) -> None:
    """trainjob.yaml with 2 nodes x 2 workers. The JobSet gives each pod the
    host name <trainjob>-trainer-node-0-<i> and the subdomain <trainjob> (its
    headless Service): other pods resolve <host>.<trainjob> and the FQDN, not
    the bare host name. The torch plugin's PET_MASTER_ADDR is
    <trainjob>-trainer-node-0-0.<trainjob>. The example sets PET_LOCAL_ADDR to
    the pod's address (status.podIP); without it (LOCAL_ADDR false), as a
    TrainJob written for torchrun has it, the job must train as well."""
    tj = manifest("trainjob.yaml", "TrainJob")
    name, tr = tj["metadata"]["name"], tj["spec"]["trainer"]
    assert tj["spec"]["runtimeRef"]["name"] == "torch-distributed"
    nodes = [f"{name}-trainer-node-0-{i}" for i in range(2)]
    t0 = time.time()
    for i, pod in enumerate(nodes):
        env = {}
        for e in tr.get("env", []):
            if "value" in e:
                env[e["name"]] = str(e["value"])
            else:  # the kubelet's part: the one field reference the example uses
                assert e["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}, e
                if local_addr:
                    env[e["name"]] = cluster.ip(i)
        env.update({"PET_NNODES": str(len(nodes)), "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": str(i),
                    "PET_MASTER_ADDR": f"{nodes[0]}.{name}", "PET_MASTER_PORT": "29500"})
        fqdn = f"{pod}.{name}.default.svc.cluster.local"
        cluster.run(pod, [*launcher_options(tr["command"]), *PROGRAM, str(STEPS), "/ck", str(STEP_S),
                          str(EVERY)], env, dns=(f"{pod}.{name}", fqdn), fqdn=(fqdn, cluster.ip(i)))
    try:
        cluster.wait_for(nodes[1], r"^\S*step 1 rank ", timeout=15)
    except AssertionError as e:
        m = re.search(r"master (\S+):\d+", cluster.logs(nodes[1]))
        if m and m.group(1) == nodes[0]:
            raise AssertionError(
                f"no step within 15 s: node rank 0 gave its peers the address {nodes[0]} (its host "
                f"name), which other pods of a JobSet cannot resolve (they resolve "
                f"{nodes[0]}.{name} and the FQDN); the workers wait for it without a word\n{e}"
            ) from None
        raise
    codes = [cluster.wait(p) for p in nodes]
    took = time.time() - t0
    outs = [cluster.logs(p) for p in nodes]
    assert codes == [0, 0], "\n".join(outs)
    check_all_trained(4, *outs)
    assert not cluster.left_running()
    report(f"TrainJob ({'as in the example' if local_addr else 'without PET_LOCAL_ADDR'}), 2 nodes x "
           f"2 workers by the headless Service's names: {STEPS} steps, {took:.1f} s")


# ---- the elastic PyTorchJob ----

def elastic_env(job: dict[str, Any], replicas: int, nproc: str) -> dict[str, str]:
    """The operator's variables for an elastic job with Worker pods only
    (elastic.go: no MASTER_ADDR, RANK or WORLD_SIZE), minReplicas kept,
    maxReplicas scaled to REPLICAS; without rdzvPort the endpoint takes the
    pytorchjob-port default, 23456."""
    name, ep = job["metadata"]["name"], job["spec"]["elasticPolicy"]
    env = {
        "PYTHONUNBUFFERED": "1",
        "PET_NPROC_PER_NODE": nproc,
        "PET_RDZV_BACKEND": ep.get("rdzvBackend", "c10d"),
        "PET_RDZV_ENDPOINT": f"{name}-worker-0:{ep.get('rdzvPort', 23456)}",
        "PET_RDZV_ID": name,
        "PET_NNODES": f"{ep['minReplicas']}:{replicas}",
        "PET_MAX_RESTARTS": str(ep["maxRestarts"]),
    }
    if ep.get("rdzvConf"):
        env["PET_RDZV_CONF"] = ",".join(f"{kv['key']}={kv['value']}" for kv in ep["rdzvConf"])
    return env


def start_elastic(c: Cluster, replicas: int = 3) -> list[str]:
    """pytorchjob-elastic.yaml, 3 worker pods x 1 worker: no server; worker-0's
    launcher hosts the rendezvous because PET_RDZV_ENDPOINT names its pod."""
    job = manifest("pytorchjob-elastic.yaml", "PyTorchJob")
    name, cont = job["metadata"]["name"], pod_container(job)
    env = literal_env(cont) | elastic_env(job, replicas, "1")
    pods = [f"{name}-worker-{i}" for i in range(replicas)]
    for pod in pods:
        c.run(pod, [*launcher_options(cont["command"]), *PROGRAM, str(STEPS), "/ck", str(STEP_S),
                    str(EVERY)], env)
    return pods


def test_elastic_pytorchjob_node_killed_re_forms_and_finishes(cluster: Cluster) -> None:
    pods = start_elastic(cluster)
    cluster.wait_for(pods[0], r"hosting the rendezvous")
    cluster.wait_for(pods[1], rf"^\S*step {KILL_AFTER} rank \d+ world 3 ")
    t = cluster.kill(pods[2])  # not the hosting pod
    codes = [cluster.wait(p) for p in pods]
    outs = [cluster.logs(p) for p in pods[:2]]
    assert codes == [0, 0, 137], "\n".join(outs)
    again = back_training(t, 2, *outs)
    check_all_trained(2, *outs)
    resumed = [s for out in outs for _, w, _, s in starts(out) if w == 2]
    assert len(resumed) == 2 and min(resumed) >= EVERY * 3, "\n".join(outs)
    assert not cluster.left_running()
    assert again < RECOVERY_S, "\n".join(outs)
    report(f"elastic PyTorchJob (worker-0 hosts), worker-2 killed: training again on 2 nodes "
           f"{again:.2f} s after the kill, from step {resumed[0]}; {STEPS} steps done")


def test_elastic_pytorchjob_hosting_pod_killed_and_replaced(cluster: Cluster) -> None:
    """The pod that hosts the rendezvous dies: the others keep trying its
    name; its replacement (the operator restarts it: 137 is retryable; here
    the same container started again, same name) hosts again and all three
    train on from the last checkpoint."""
    pods = start_elastic(cluster)
    cluster.wait_for(pods[1], rf"^\S*step {KILL_AFTER} rank \d+ world 3 ")
    t = cluster.kill(pods[0])
    assert cluster.wait(pods[0]) == 137
    # its network torn down (conmon started that when it died) before it is
    # set up again, as a replacement pod's comes after the old one's is gone
    podman("container", "cleanup", cluster.name(pods[0]))
    podman("start", cluster.name(pods[0]), check=True)
    codes = [cluster.wait(p) for p in pods]
    outs = [cluster.logs(p) for p in pods]
    assert codes == [0, 0, 0], "\n".join(outs)
    assert outs[0].count("hosting the rendezvous") == 2, outs[0]
    again = back_training(t, 3, *outs)
    check_all_trained(3, *outs)
    assert not cluster.left_running()
    assert again < RECOVERY_S, "\n".join(outs)
    report(f"elastic PyTorchJob, the hosting worker-0 killed and started again at once: all 3 "
           f"training again {again:.2f} s after the kill")


def test_elastic_pytorchjob_with_rdzv_server_node_killed(cluster: Cluster, tmp_path: Path) -> None:
    """pytorchjob-elastic-server.yaml against rdzv-server.yaml's server (its
    Service name as the container's network alias, its token from a file as
    from the Secret): worker-0 killed, the other two go on at once."""
    job = manifest("pytorchjob-elastic-server.yaml", "PyTorchJob")
    name, cont = job["metadata"]["name"], pod_container(job)
    dep = manifest("rdzv-server.yaml", "Deployment")
    svc = manifest("rdzv-server.yaml", "Service")["metadata"]["name"]
    srv = dep["spec"]["template"]["spec"]["containers"][0]
    token = tmp_path / "token"
    token.write_text(uuid.uuid4().hex)
    token_dir = srv["volumeMounts"][0]["mountPath"]
    cluster.run(svc, srv["command"][1:], {}, entrypoint=srv["command"][0],
                mounts=(f"{token}:{token_dir}/token:ro",))
    env = literal_env(cont, PET_NPROC_PER_NODE="1", GPULAUNCH_RDZV_TOKEN=token.read_text())
    env.update(elastic_env(job, 3, "1"))  # PET_RDZV_ENDPOINT: the command line's wins
    pods = [f"{name}-worker-{i}" for i in range(3)]
    for pod in pods:
        cluster.run(pod, [*launcher_options(cont["command"]), *PROGRAM, str(STEPS), "/ck", str(STEP_S),
                          str(EVERY)], env)
    cluster.wait_for(pods[1], rf"^\S*step {KILL_AFTER} rank \d+ world 3 ")
    t = cluster.kill(pods[0])
    codes = [cluster.wait(p) for p in pods]
    outs = [cluster.logs(p) for p in pods[1:]]
    assert codes == [137, 0, 0], "\n".join(outs)
    again = back_training(t, 2, *outs)
    check_all_trained(2, *outs)
    srv_log = cluster.logs(svc)
    assert f"node {pods[0]}" in srv_log and "round 1 over" in srv_log, srv_log
    podman("stop", "-t", "5", cluster.name(svc))
    assert not cluster.left_running()
    assert again < RECOVERY_S, "\n".join(outs)
    report(f"elastic PyTorchJob with a gpulaunch-rdzv container, worker-0 killed: training again on "
           f"2 nodes {again:.2f} s after the kill")
