"""A one-node SLURM cluster for the tests: Debian's ``slurm-wlm`` and ``munge`` (installed with apt-get when missing),
``munged`` as the munge user, ``slurmctld`` and ``slurmd`` as root, all in a folder of their own.

The cluster's configuration is ``<root>/slurm.conf`` (clients find it through ``$SLURM_CONF``): the node as
``slurmd -C`` sees it (its real CPUs and memory), ``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``,
``SelectType=select/cons_tres``, free TCP ports and its own munge socket, so it clashes with no other cluster on the
machine. :func:`start` returns a :class:`Cluster`; :meth:`Cluster.stop` ends the three daemons it started (by their
process ids) and nothing else. ``python tests/slurm_cluster.py`` starts one, prints ``export SLURM_CONF=...`` and
keeps it up until Ctrl-C or SIGTERM, to try things by hand.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

PACKAGES = ("slurm-wlm", "munge")
DAEMONS = ("munged", "slurmctld", "slurmd")


class Unavailable(Exception):
    """The cluster cannot start here (one line saying why)."""


@dataclasses.dataclass
class Cluster:
    root: str
    procs: dict
    partition: str = "debug"

    @property
    def env(self) -> dict:
        """The variables a client (``sbatch``, ``squeue``, a job) needs: ``SLURM_CONF``."""
        return {"SLURM_CONF": os.path.join(self.root, "slurm.conf")}

    def stop(self) -> None:
        """Cancel the jobs left in this cluster (a test that failed midway), then stop the daemons it started
        (SIGTERM, then SIGKILL after 10 s), the last started first."""
        if self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
            env = dict(os.environ, **self.env)
            subprocess.run(["scancel", f"--user={os.getuid()}"], env=env, stderr=subprocess.DEVNULL)
            deadline = time.time() + 30
            while time.time() < deadline and subprocess.run(
                    ["squeue", "-h"], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout.strip():
                time.sleep(0.5)
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs.clear()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def install() -> None:
    """apt-get install the packages whose daemons are missing; :class:`Unavailable` where that is not possible."""
    if all(shutil.which(d) or os.path.exists(f"/usr/sbin/{d}") for d in DAEMONS):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise Unavailable("no SLURM here (slurmctld, slurmd or munged missing) and no root apt-get to install "
                          f"{' '.join(PACKAGES)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run = lambda *cmd: subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,  # noqa: E731
                                      text=True, timeout=600)
    done = run("apt-get", "install", "-y", "-q", *PACKAGES)
    if done.returncode:
        run("apt-get", "update", "-q")
        done = run("apt-get", "install", "-y", "-q", *PACKAGES)
    if done.returncode:
        raise Unavailable(f"apt-get install {' '.join(PACKAGES)} failed: {done.stdout.strip().splitlines()[-1]}")


def _wait(what: str, check, proc_logs: dict, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return
        for name, (proc, log) in proc_logs.items():
            if proc.poll() is not None:
                raise Unavailable(f"{name} exited {proc.returncode} while starting: "
                                  f"{_tail(log)}")
        time.sleep(0.2)
    raise Unavailable(f"{what} did not come up in {timeout:g} s")


def _tail(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return "(no log)"
    return lines[-1] if lines else "(no log)"


def start(root: str | None = None) -> Cluster:
    """Install what is missing, write the configuration under ``root`` (a new temporary folder by default), start
    munged, slurmctld and slurmd, and wait until the node takes jobs. :class:`Unavailable` (nothing left running)
    where it cannot."""
    if os.geteuid() != 0:
        raise Unavailable("a test SLURM cluster needs root (its daemons run as root and as the munge user)")
    install()
    root = root or tempfile.mkdtemp(prefix="hf_condinit-slurm-")
    try:
        munge_user = pwd.getpwnam("munge")
    except KeyError:
        raise Unavailable("no munge user (the munge package makes it)") from None
    munge_dir = os.path.join(root, "munge")
    os.makedirs(munge_dir, exist_ok=True)
    os.chmod(root, 0o755)
    os.chown(munge_dir, munge_user.pw_uid, munge_user.pw_gid)
    os.chmod(munge_dir, 0o755)  # munged wants its socket folder open to all
    sock = os.path.join(munge_dir, "munge.socket")
    for sub in ("state", "spool"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    node = subprocess.run(["slurmd", "-C"], stdout=subprocess.PIPE, text=True, check=True).stdout.splitlines()[0]
    host = node.split()[0].split("=", 1)[1]
    conf = os.path.join(root, "slurm.conf")
    with open(conf, "w", encoding="utf-8") as f:
        f.write("\n".join([
            "ClusterName=hfcondinit-test",
            f"SlurmctldHost={host}",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={sock}",
            f"StateSaveLocation={root}/state",
            f"SlurmdSpoolDir={root}/spool",
            f"SlurmctldPidFile={root}/slurmctld.pid",
            f"SlurmdPidFile={root}/slurmd.pid",
            f"SlurmctldLogFile={root}/slurmctld.log",
            f"SlurmdLogFile={root}/slurmd.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=2",
            "MpiDefault=none",
            "ReturnToService=2",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "MinJobAge=600",
            "KillWait=10",
            node.split(" UpTime=")[0] + " State=UNKNOWN",
            f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP",
        ]) + "\n")
    env = dict(os.environ, SLURM_CONF=conf)
    cluster = Cluster(root, {})
    logs: dict = {}

    def launch(name, cmd, **kw):
        log = os.path.join(root, f"{name}.out")
        with open(log, "w") as out:
            cluster.procs[name] = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                                   stdin=subprocess.DEVNULL, **kw)
        logs[name] = (cluster.procs[name], log)

    try:
        launch("munged", ["munged", "-F", f"--socket={sock}", f"--pid-file={munge_dir}/munged.pid",
                          f"--log-file={munge_dir}/munged.log", f"--seed-file={munge_dir}/munged.seed"],
               user=munge_user.pw_uid, group=munge_user.pw_gid)
        _wait("munged", lambda: os.path.exists(sock), logs)
        launch("slurmctld", ["slurmctld", "-D", "-i", "-f", conf])
        _wait("slurmctld", lambda: _quiet(["scontrol", "ping"], env), logs)
        launch("slurmd", ["slurmd", "-D", "-f", conf])
        _wait("the node", lambda: _idle(env), logs)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _quiet(cmd, env) -> bool:
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return done.returncode == 0 and "DOWN" not in done.stdout


def _idle(env) -> bool:
    done = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True)
    return done.returncode == 0 and done.stdout.strip() == "idle"


if __name__ == "__main__":
    cluster = start()
    print(f"export SLURM_CONF={cluster.env['SLURM_CONF']}   # Ctrl-C (or SIGTERM) stops the cluster", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
