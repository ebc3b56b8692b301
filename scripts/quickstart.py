"""The quickstart's orchestration (run through scripts/quickstart, which installs and builds
what it needs first): a Kafka-compatible broker (Tansu), a coordinator, a storage node and an
ingestor of pipelines/quickstart.yaml; sample orders produced into the topic while a progress
line shows them flowing; then a FINAL query and an aggregate compared with what the generator
says it sent, and how to reach each service.

Every process it starts is stopped on the way out, on Ctrl-C and on SIGTERM; without --keep,
a process whose parent dies is killed by the kernel (PR_SET_PDEATHSIG), so not even a SIGKILL
of this script leaves one behind. With --keep the stack stays up until `--stop`.

Standard library only: it runs before any virtualenv exists."""

import argparse
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = ".mergestream-quickstart"
STATE = "processes.json"
# The shutdown order: the ingestor flushes and commits first, the broker goes last.
ORDER = ["ingestor", "storage-node", "coordinator", "kafka"]
DEFAULT_PORTS = {"kafka": 9092, "coordinator": 2181, "raft": 9234, "storage": 9100, "storage_metrics": 9363,
                 "ingestor_metrics": 9300, "coordinator_metrics": 9302}
PORT_ROLES = {"kafka": "the Kafka broker", "coordinator": "the coordinator's client port",
              "raft": "the coordinator's raft port", "storage": "the storage node's gRPC port",
              "storage_metrics": "the storage node's metrics", "ingestor_metrics": "the ingestor's metrics",
              "coordinator_metrics": "the coordinator's metrics"}


class QuickstartError(Exception):
    pass


def parse_args(argv):
    p = argparse.ArgumentParser(prog="scripts/quickstart", description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=20_000, help="sample messages to produce (default 20000)")
    p.add_argument("--rate", type=int, default=2_000, help="messages per second, 0 for unlimited (default 2000)")
    p.add_argument("--keys", type=int, default=2_000, help="distinct order ids (default 2000)")
    p.add_argument("--seed", type=int, default=1, help="the generator's seed (default 1)")
    p.add_argument("--dir", type=Path, default=ROOT / "quickstart-data",
                   help="where data and logs go; remade on every run (default ./quickstart-data)")
    p.add_argument("--keep", action="store_true", help="leave the stack up at the end (stop it with --stop)")
    p.add_argument("--stop", action="store_true", help="stop the stack a --keep run left up, and exit")
    p.add_argument("--free-ports", action="store_true",
                   help="pick free ports instead of the defaults (9092, 2181, 9100, …)")
    p.add_argument("--bin-dir", type=Path, default=ROOT / "target" / "release", help="where the binaries are")
    p.add_argument("--tansu", type=Path, help="the Tansu broker binary")
    args = p.parse_args(argv)
    for name in ("count", "keys"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.rate < 0:
        p.error("--rate must not be negative")
    return args


def port_free(port):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_ports(free):
    if not free:
        for name, port in DEFAULT_PORTS.items():
            if not port_free(port):
                raise QuickstartError(f"port {port} ({PORT_ROLES[name]}) is in use: stop what holds it, or run "
                                      "with --free-ports")
        return dict(DEFAULT_PORTS)
    ports = {}
    for name in DEFAULT_PORTS:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports[name] = s.getsockname()[1]
    return ports


def port_open(port):
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def four_letter(port, word):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(word.encode())
            return s.recv(64).decode(errors="replace")
    except OSError:
        return ""


def die_with_parent():
    """Runs in the child before exec: the kernel kills it when this script's process ends."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Stack:
    def __init__(self, workdir, keep):
        self.workdir = workdir
        self.keep = keep
        self.procs = {}  # name → Popen, in start order

    def start(self, name, argv, stdout=None):
        log = open(self.workdir / "logs" / f"{name}.log", "ab")
        proc = subprocess.Popen([str(a) for a in argv], stdout=stdout or log, stderr=log, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=None if self.keep else die_with_parent)
        log.close()
        self.procs[name] = proc
        print(f"  started {name:<12} pid {proc.pid:<7} log {self.workdir / 'logs' / (name + '.log')}", flush=True)
        return proc

    def wait_ready(self, name, ready, what, timeout=60):
        deadline = time.monotonic() + timeout
        while not ready():
            proc = self.procs[name]
            if proc.poll() is not None:
                raise QuickstartError(f"{name} exited with {proc.returncode} before {what}: see "
                                      f"{self.workdir / 'logs' / (name + '.log')}")
            if time.monotonic() > deadline:
                raise QuickstartError(f"{name}: no {what} after {timeout} s: see "
                                      f"{self.workdir / 'logs' / (name + '.log')}")
            time.sleep(0.1)

    def save(self):
        state = {name: [proc.pid, str(proc.args[0])] for name, proc in self.procs.items() if proc.poll() is None}
        (self.workdir / STATE).write_text(json.dumps(state))

    def stop(self):
        if not self.procs:
            return  # nothing started, or handed over to a later --stop (--keep)
        names = sorted(self.procs, key=lambda n: ORDER.index(n) if n in ORDER else -1)
        for name in names:
            proc = self.procs[name]
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        (self.workdir / STATE).unlink(missing_ok=True)


def prepare_dir(workdir):
    """Remakes the quickstart's directory, refusing one that holds anything else."""
    if workdir.exists():
        if not (workdir / MARKER).exists() and any(workdir.iterdir()):
            raise QuickstartError(f"{workdir} is not empty and was not made by the quickstart: give another --dir")
        if running(workdir):
            raise QuickstartError(f"a quickstart left running from {workdir} (pids {', '.join(map(str, running(workdir).values()))}): "
                                  "stop it first with scripts/quickstart --stop")
        shutil.rmtree(workdir)
    (workdir / "logs").mkdir(parents=True)
    (workdir / MARKER).write_text("made by scripts/quickstart; removed by its next run\n")


def running(workdir):
    try:
        state = json.loads((workdir / STATE).read_text())
    except (OSError, ValueError):
        return {}
    alive = {}
    for name, entry in state.items() if isinstance(state, dict) else ():
        if not (isinstance(entry, list) and len(entry) == 2):
            continue
        pid, program = entry
        # A pid the kernel has since given to another program is not ours to stop.
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if argv0 == program and pid_alive(pid):
            alive[name] = pid
    return alive


def stop_kept(workdir):
    alive = running(workdir)
    if not alive:
        print(f"nothing left running from {workdir}")
        (workdir / STATE).unlink(missing_ok=True)
        return
    for name in sorted(alive, key=lambda n: ORDER.index(n) if n in ORDER else -1):
        pid = alive[name]
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and pid_alive(pid):
            time.sleep(0.1)
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
        print(f"  stopped {name} (pid {pid})")
    (workdir / STATE).unlink(missing_ok=True)


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    # A stopped child of ours that no one reaped yet is gone for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def scrape(port):
    """Sums of the ingestor's rows and lag, from its Prometheus endpoint."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).read().decode()
    except OSError:
        return None
    sums = {"rows": 0.0, "lag": 0.0}
    for line in text.splitlines():
        for key, metric in (("rows", "mergestream_ingestor_rows_total"), ("lag", "mergestream_ingestor_consumer_lag_messages")):
            if re.match(rf"{metric}(\{{|\s)", line):
                sums[key] += float(line.rsplit(" ", 1)[1])
    return sums


class ProducerOutput:
    """The producer's progress lines (stderr) and its final expected state (stdout)."""

    def __init__(self, proc, log_path):
        self.proc = proc
        self.produced = 0
        self.expected = None
        self.log = open(log_path, "a")
        self.threads = [threading.Thread(target=self.read_progress, daemon=True),
                        threading.Thread(target=self.read_result, daemon=True)]
        for t in self.threads:
            t.start()

    def read_progress(self):
        for line in self.proc.stderr:
            self.log.write(line)
            self.log.flush()
            m = re.match(r"\r?produced (\d+) of", line.split("\r")[-1])
            if m:
                self.produced = int(m.group(1))

    def read_result(self):
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.expected = json.loads(line)

    def finished(self):
        if self.proc.poll() is None:
            return False
        for t in self.threads:
            t.join(5)
        return True


def client(bin_dir, port, query, fmt="TSV"):
    out = subprocess.run([str(bin_dir / "storage-node"), "client", "--addr", f"127.0.0.1:{port}", "--format", fmt,
                          "--query", query], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise QuickstartError(f"query {query!r} failed: {out.stderr.strip()}")
    return out.stdout


def show_progress(line, terminal, final=False):
    if terminal:
        sys.stdout.write("\r" + line + "\x1b[K" + ("\n" if final else ""))
    else:
        sys.stdout.write(line + "\n")
    sys.stdout.flush()


def run(args):
    for binary in ("storage-node", "coordinator", "ingestor"):
        if not (args.bin_dir / binary).exists():
            raise QuickstartError(f"{args.bin_dir / binary} is missing: build it with cargo build --release")
    if not args.tansu or not args.tansu.exists():
        raise QuickstartError(f"the Tansu broker binary {args.tansu} is missing (scripts/quickstart installs it)")
    workdir = args.dir.resolve()
    prepare_dir(workdir)
    ports = pick_ports(args.free_ports)
    bins = args.bin_dir
    stack = Stack(workdir, args.keep)
    terminal = sys.stdout.isatty()
    try:
        print(f"starting the stack in {workdir}")
        kafka = f"127.0.0.1:{ports['kafka']}"
        stack.start("kafka", [args.tansu, "broker", "--listener-url", f"tcp://{kafka}", "--advertised-listener-url",
                              f"tcp://{kafka}", "--storage-engine", "memory://tansu/"])
        stack.start("coordinator", [bins / "coordinator", "serve", "--node-id", "1", "--client-addr",
                                    f"127.0.0.1:{ports['coordinator']}", "--raft-addr", f"127.0.0.1:{ports['raft']}",
                                    "--data-dir", workdir / "coordinator", "--metrics-addr",
                                    f"127.0.0.1:{ports['coordinator_metrics']}"])
        stack.wait_ready("kafka", lambda: port_open(ports["kafka"]), "listening")
        stack.wait_ready("coordinator", lambda: four_letter(ports["coordinator"], "ruok") == "imok", "serving")
        coordinator = f"127.0.0.1:{ports['coordinator']}"
        stack.start("storage-node", [bins / "storage-node", "serve", "--path", workdir / "storage", "--grpc-addr",
                                     f"127.0.0.1:{ports['storage']}", "--coordinator", coordinator, "--metrics-addr",
                                     f"127.0.0.1:{ports['storage_metrics']}"])
        stack.wait_ready("storage-node", lambda: port_open(ports["storage"]), "serving")
        pipeline = workdir / "pipeline.yaml"
        pipeline.write_text((ROOT / "pipelines" / "quickstart.yaml").read_text().replace("127.0.0.1:9092", kafka))

        print(f"producing {args.count} sample orders over {args.keys} order ids (updates and deletes among them)"
              + (f" at {args.rate}/s" if args.rate else ""), flush=True)
        producer_proc = subprocess.Popen(
            [str(bins / "ingestor"), "produce", "--brokers", kafka, "--topic", "orders", "--count", str(args.count),
             "--rate", str(args.rate), "--keys", str(args.keys), "--seed", str(args.seed)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, bufsize=1,
            start_new_session=True, preexec_fn=die_with_parent)
        stack.procs["producer"] = producer_proc
        print(f"  started {'producer':<12} pid {producer_proc.pid:<7} log {workdir / 'logs' / 'producer.log'}",
              flush=True)
        producer = ProducerOutput(producer_proc, workdir / "logs" / "producer.log")
        # The producer creates the topic before its first message; the ingestor starts after.
        stack.wait_ready("producer", lambda: producer.produced > 0 or producer_proc.poll() is not None,
                         "first message")
        stack.start("ingestor", [bins / "ingestor", "run", "--pipeline", pipeline, "--storage-node",
                                 f"127.0.0.1:{ports['storage']}", "--coordinator", coordinator, "--instance",
                                 "quickstart", "--metrics-addr", f"127.0.0.1:{ports['ingestor_metrics']}"])

        started, last_change, last_rows, last_line = time.monotonic(), time.monotonic(), -1.0, 0.0
        while True:
            done_producing = producer.finished()
            if done_producing and producer_proc.returncode != 0:
                raise QuickstartError(f"the producer failed: see {workdir / 'logs' / 'producer.log'}")
            if stack.procs["ingestor"].poll() is not None:
                raise QuickstartError(f"the ingestor exited with {stack.procs['ingestor'].returncode}: see "
                                      f"{workdir / 'logs' / 'ingestor.log'}")
            metrics = scrape(ports["ingestor_metrics"]) or {"rows": 0.0, "lag": 0.0}
            rows = metrics["rows"]
            now = time.monotonic()
            if rows != last_rows:
                last_rows, last_change = rows, now
            # The lag gauge is refreshed every few seconds: done is every row in and a lag seen at 0.
            finished = (done_producing and producer.expected is not None and rows >= producer.expected["messages"]
                        and metrics["lag"] == 0)
            if finished or terminal or now - last_line >= 2:
                last_line = now
                show_progress(f"  produced {producer.produced:>8} of {args.count}   ingested {int(rows):>8} rows   "
                              f"lag {int(metrics['lag']):>7}   {now - started:5.1f} s", terminal, final=finished)
            if finished:
                break
            if now - last_change > 60:
                raise QuickstartError(f"no rows ingested for 60 s: see {workdir / 'logs'}")
            time.sleep(0.5)

        expected = producer.expected
        storage = ports["storage"]
        def show(query, comment=""):
            print(f"\n{query}{comment}")
            print(client(bins, storage, query, "PrettyCompact"), end="")

        show("SELECT count() AS rows, uniqExact(id) AS ids, count(DISTINCT _part) AS parts FROM orders",
             "   -- without FINAL: versions that merges have not yet replaced")
        final_query = "SELECT count() AS orders, sum(amount) AS amount FROM orders FINAL"
        show(final_query, "   -- the latest version, deletes dropped")
        by_status = ("SELECT status, count() AS orders, sum(amount) AS amount, round(avg(amount), 2) AS average "
                     "FROM orders FINAL GROUP BY status ORDER BY status")
        show(by_status)
        show("SELECT id, customer, amount, status, version FROM orders FINAL ORDER BY id LIMIT 5")

        got = client(bins, storage, final_query).split()
        got_status = [line.split("\t") for line in client(bins, storage, by_status).splitlines()]
        want = [str(expected["live"]), expected["amount"]]
        want_status = [[s, str(n), a] for s, (n, a) in expected["by_status"].items()]
        agreed = got == want and [row[:3] for row in got_status] == want_status
        print(f"\nthe generator sent {expected['messages']} messages about {expected['orders']} orders, "
              f"{expected['deleted']} of them deleted at the end: it expects {expected['live']} orders "
              f"worth {expected['amount']}")
        if not agreed:
            raise QuickstartError(f"FINAL shows {got} and {got_status}, the generator expects {want} and {want_status}")
        print(f"FINAL matches: {expected['live']} orders, amount {expected['amount']}")

        print(f"""
how to reach each service:
  Kafka broker      {kafka}   (topic orders, 4 partitions)
  coordinator       {coordinator}   (ZooKeeper protocol: echo mntr | nc 127.0.0.1 {ports['coordinator']})
  storage node      127.0.0.1:{storage}   ({bins / 'storage-node'} client --addr 127.0.0.1:{storage} --query "SELECT count() FROM orders FINAL")
  metrics           http://127.0.0.1:{ports['storage_metrics']}/metrics (storage node), http://127.0.0.1:{ports['ingestor_metrics']}/metrics (ingestor),
                    http://127.0.0.1:{ports['coordinator_metrics']}/metrics (coordinator); every metric: docs/metrics.md
  logs              {workdir / 'logs'}""")
        if args.keep:
            del stack.procs["producer"]
            stack.save()
            print(f"\nthe stack stays up (--keep); stop it with: scripts/quickstart --stop --dir {workdir}")
            stack.procs.clear()
            return 0
        print("\nstopping (run with --keep to leave the stack up)")
        return 0
    finally:
        stack.stop()


def main(argv):
    args = parse_args(argv)
    if args.stop:
        stop_kept(args.dir.resolve())
        return 0

    def terminated(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminated)
    try:
        code = run(args)
    except KeyboardInterrupt:
        print("\ninterrupted: every process the quickstart started is stopped", file=sys.stderr)
        return 130
    except QuickstartError as e:
        print(f"\nquickstart: {e}", file=sys.stderr)
        return 1
    print("done")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
