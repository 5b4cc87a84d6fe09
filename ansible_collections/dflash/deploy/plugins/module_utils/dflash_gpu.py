# Who holds the GPUs of a target: nvidia-smi's GPUs and compute processes as seen from inside
# the target, the pid namespaces of the job's processes there (probe, on the target), and
# that judged against the job's GPU layout (judge, pure, on the controller).
from __future__ import annotations

import os
import re
import shutil
import subprocess

GPU_QUERY = ("index", "uuid", "name", "pci.bus_id", "memory.used", "memory.total",
             "driver_version")  # fmt: skip
APP_QUERY = ("pid", "process_name", "used_memory", "gpu_uuid")
# A hung GPU or driver can hang nvidia-smi too; verify must still answer.
SMI_TIMEOUT_S = 30
# MiB in use on a GPU beyond what its listed processes hold that count as held by no live
# process (a crashed job's context); the driver's own share is far below it.
UNOWNED_MIB = 1024
# The inode of the kernel's initial pid namespace (PROC_PID_INIT_INO): a reader there sees
# the pids the NVIDIA driver reports.
INIT_PID_NAMESPACE = "pid:[4026531836]"
_NO_HANDLE = re.compile(r"Unable to determine the device handle for GPU\s*([0-9A-Fa-f:.]+):\s*(.*)")
_LOST = ("GPU is lost", "Unknown Error")


def _field(text: str) -> str | None:
    """A CSV value; nvidia-smi writes what it cannot tell as [N/A], [Not Supported], ..."""
    text = text.strip()
    return None if not text or text.startswith("[") or text == "N/A" else text


def _mib(text: str) -> int | None:
    value = _field(text)
    try:
        return None if value is None else int(float(value))
    except ValueError:
        return None


def parse_gpus(text: str) -> tuple[list[dict], list[str]]:
    """GPU rows of `nvidia-smi --query-gpu=GPU_QUERY --format=csv,noheader,nounits`, and what
    else it printed: GPUs it could not reach ("Unable to determine the device handle for GPU
    0000:41:00.0: GPU is lost", a GPU fallen off the bus) or why it failed as a whole."""
    gpus: list[dict] = []
    problems: list[str] = []
    for line in (raw.strip() for raw in text.splitlines()):
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == len(GPU_QUERY) and parts[0].isdigit():
            lost = next((p.strip("[]") for p in parts if any(w in p for w in _LOST)), None)
            gpus.append({
                "index": int(parts[0]), "uuid": parts[1], "name": _field(parts[2]),
                "bus_id": _field(parts[3]), "memory_used_mib": _mib(parts[4]),
                "memory_total_mib": _mib(parts[5]), "driver": _field(parts[6]), "lost": lost,
            })  # fmt: skip
        elif line:
            found = _NO_HANDLE.search(line)
            problems.append(f"GPU {found[1]}: {found[2]}" if found else line)
    return gpus, problems


def parse_apps(text: str) -> list[dict]:
    """Rows of `nvidia-smi --query-compute-apps=APP_QUERY --format=csv,noheader,nounits`."""
    apps = []
    for line in text.splitlines():
        pid, _, rest = line.partition(",")
        parts = rest.rsplit(",", 2)  # the name may hold commas; the last two fields cannot
        if pid.strip().isdigit() and len(parts) == 3:
            apps.append({
                "pid": int(pid), "name": parts[0].strip(), "used_mib": _mib(parts[1]),
                "gpu_uuid": parts[2].strip(),
            })  # fmt: skip
    return apps


def ns_pids(pid: int) -> list[int] | None:
    """The process's pid in each pid namespace from this reader's down to its own (NStgid of
    /proc/PID/status); None when there is no such process here."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    found = fields.get("NStgid") or fields.get("Tgid") or ""  # NStgid: Linux 4.1 and later
    return [int(value) for value in found.split()] or None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def in_init_pid_namespace() -> bool:
    try:
        return os.readlink("/proc/self/ns/pid") == INIT_PID_NAMESPACE
    except OSError:
        return False


def view(apps: list[dict], job_pids: list[int]) -> dict:
    """What this reader's pid namespace says about nvidia-smi's processes: the job's
    processes with their pids in every namespace, and each listed pid visible here."""
    job = [{"pid": pid, "ns": ns_pids(pid) or [pid]} for pid in job_pids]
    local = []
    for pid in sorted({app["pid"] for app in apps}):
        ns = ns_pids(pid)
        if ns is not None:
            local.append({"pid": pid, "ns": ns, "cmdline": _cmdline(pid)})
    return {"in_init_pid_namespace": in_init_pid_namespace(), "job": job, "local": local}


def _query(smi: str, query: str) -> tuple[int, str] | None:
    try:
        proc = subprocess.run(
            [smi, query, "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None
    return proc.returncode, f"{proc.stdout}\n{proc.stderr}"


def probe(job_pids: list[int]) -> dict:
    """nvidia-smi's GPUs and compute processes with this reader's view of their pids;
    {"smi": None} where there is no nvidia-smi (a CPU target)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"smi": None}
    found: dict = {"smi": smi, "gpus": [], "problems": [], "apps": []}
    answer = _query(smi, "--query-gpu=" + ",".join(GPU_QUERY))
    if answer is None:
        found["problems"].append(f"nvidia-smi gave no answer within {SMI_TIMEOUT_S} s")
    else:
        found["gpus"], found["problems"] = parse_gpus(answer[1])
        if answer[0] != 0 and not found["gpus"] and not found["problems"]:
            found["problems"].append(f"nvidia-smi exited {answer[0]}")
    apps = _query(smi, "--query-compute-apps=" + ",".join(APP_QUERY))
    found["apps"] = parse_apps(apps[1]) if apps else []
    found.update(view(found["apps"], job_pids))
    return found


def judge(found: dict | None, layout_gpus: list[int], job_running: bool,
          unowned_mib: int = UNOWNED_MIB) -> dict:  # fmt: skip
    """The job's GPUs against what `probe` found. `applies` is False (with `why`) without
    nvidia-smi or GPUs in the layout. Else: `missing` GPUs of the layout (absent, lost);
    `foreign` processes on them (pid, command, MiB); `crowded` GPUs, where the pids are the
    node's (the driver does not translate pid namespaces) and more processes hold the GPU
    than the job runs there, so which is foreign cannot be told from inside; `unowned`
    memory held by no listed process."""
    if not found or found.get("smi") is None:
        return {"applies": False, "why": "no nvidia-smi on the target (a CPU target)"}
    if not layout_gpus:
        return {"applies": False, "why": "the layout uses no GPU (CPU mode)"}
    by_index = {gpu["index"]: gpu for gpu in found["gpus"]}
    missing = []
    for index in layout_gpus:
        if index not in by_index:
            said = "".join(f"; nvidia-smi: {problem}" for problem in found["problems"])
            missing.append({"gpu": index, "why": f"not listed by nvidia-smi{said}"})
        elif by_index[index]["lost"]:
            missing.append({"gpu": index, "why": f"lost: {by_index[index]['lost']}"})
    ours = {gpu["uuid"]: gpu["index"] for gpu in found["gpus"] if gpu["index"] in layout_gpus}
    rows = [dict(app, gpu=ours[app["gpu_uuid"]]) for app in found["apps"]
            if app["gpu_uuid"] in ours]  # fmt: skip
    job_pids = {pid for proc in found["job"] for pid in proc["ns"]}
    local = {proc["pid"]: proc for proc in found["local"]}
    # A reader in the initial pid namespace sees the driver's pids; elsewhere only a driver
    # that translates pid namespaces names the job's processes by the pids seen here.
    pids_here = found["in_init_pid_namespace"] or any(r["pid"] in job_pids for r in rows)
    foreign, crowded = [], []
    if pids_here or not job_running:
        for row in rows:
            if row["pid"] not in job_pids:
                seen = local.get(row["pid"]) if pids_here else None
                foreign.append({
                    "pid": row["pid"], "gpu": row["gpu"], "used_mib": row["used_mib"],
                    "command": (seen or {}).get("cmdline") or row["name"],
                    "visible": seen is not None,
                })  # fmt: skip
    else:
        for index in layout_gpus:
            held = [row for row in rows if row["gpu"] == index]
            if len(held) > 1:  # one process per GPU: the job's rank there
                crowded.append({"gpu": index, "processes": held})
    unowned = []
    for index in layout_gpus:
        gpu = by_index.get(index)
        if gpu is None or gpu["lost"] or gpu["memory_used_mib"] is None:
            continue
        listed = [app["used_mib"] for app in found["apps"] if app["gpu_uuid"] == gpu["uuid"]]
        # Without every process's share (some drivers in containers give none) nothing adds up.
        if None not in listed and gpu["memory_used_mib"] - sum(listed) > unowned_mib:
            unowned.append(
                {"gpu": index, "used_mib": gpu["memory_used_mib"], "listed_mib": sum(listed)}
            )
    return {
        "applies": True,
        "gpus": list(layout_gpus),
        "pids": "here" if pids_here else "node",
        "missing": missing,
        "foreign": foreign,
        "crowded": crowded,
        "unowned": unowned,
    }


def judge_facts(facts: dict) -> dict:
    """`judge` for a dflash_facts document: its GPU probe against the layout that the
    deployment of current recorded, with the job running when any trainer process runs."""
    deployment = facts.get("deployment")
    if not deployment:
        return {"applies": False, "why": "no deployment of current recorded, so no GPU layout"}
    layout = (deployment.get("run_sh") or {}).get("layout") or {}
    gpus = sorted(set(layout.get("target") or []) | set(layout.get("drafter") or []))
    running = bool((facts.get("trainers") or {}).get("processes"))
    return judge(facts.get("gpu"), gpus, running)
