"""A raw PMI client that spawns a job the way MPICH's simple_pmi.c would.

Debian's MPICH cannot call MPI_Comm_spawn (its UCX netmod has no dynamic processes), so
the spawn path is exercised with the wire bytes docs/pmi.md describes, for PMI-1 and PMI-2.
Usage: spawn_client.py 1|2   (run under rlaunch; the spawned children run the same file)
SPAWN_INFO="key=value;..." gives the spawn those hints; each child prints the host it runs
on after "on", and the PMI_process_mapping its job has after "map".
"""
import os
import socket
import sys

VERSION = sys.argv[1]
sock = socket.socket(fileno=int(os.environ["PMI_FD"]))
stream = sock.makefile("rb", buffering=0)


def line(text):
    sock.sendall(text.encode() + b"\n")
    return stream.readline().decode().strip()


def pmi2(body):
    data = body.encode()
    sock.sendall(b"%-6d" % len(data) + data)
    size = int(stream.read(6))
    reply = stream.read(size).decode()
    return dict(p.split("=", 1) for p in reply.split(";") if p)


spawned = os.environ.get("PMI_SPAWNED") == "1"
# torchrun's view of the rank, which a spawned job has of its own.
env = os.environ
torch = f"torch {env['RANK']}/{env['WORLD_SIZE']} group {env['GROUP_RANK']}/{env['GROUP_WORLD_SIZE']}"
hints = [h.split("=", 1) for h in os.environ.get("SPAWN_INFO", "").split(";") if h]
me = os.environ["PMI_RANK"]
if VERSION == "1":
    assert line("cmd=init pmi_version=1 pmi_subversion=1").endswith("rc=0")
    kvs = line("cmd=get_my_kvsname").split("kvsname=")[1]
    if spawned:
        port = line(f"cmd=get kvsname={kvs} key=PARENT_ROOT_PORT_NAME").split("value=")[1]
        line(f"cmd=put kvsname={kvs} key=child{me} value=here{me}")
        assert line("cmd=barrier_in") == "cmd=barrier_out"
        peer = line(f"cmd=get kvsname={kvs} key=child0").split("value=")[1]
        mapping = line(f"cmd=get kvsname={kvs} key=PMI_process_mapping").split("value=")[1]
        print(f"child {me} of {os.environ['PMI_SIZE']} kvs {kvs} port {port} peer {peer} {torch} on {socket.gethostname()} map {mapping}", flush=True)
    else:
        block = [
            "mcmd=spawn", f"nprocs={os.environ.get('SPAWN_NPROCS', '2')}", f"execname={sys.executable}", "totspawns=1", "spawnssofar=1",
            f"arg1={os.path.abspath(__file__)}", "arg2=1", "argcnt=2", "preput_num=1",
            "preput_key_0=PARENT_ROOT_PORT_NAME", "preput_val_0=port-of-parent", f"info_num={len(hints)}",
        ]
        for i, (key, value) in enumerate(hints):
            block += [f"info_key_{i}={key}", f"info_val_{i}={value}"]
        sock.sendall(("\n".join(block) + "\nendcmd\n").encode())
        print(f"parent {me} {stream.readline().decode().strip()}", flush=True)
    assert line("cmd=finalize") == "cmd=finalize_ack"
else:
    assert line("cmd=init pmi_version=2 pmi_subversion=0").endswith("rc=0")
    init = pmi2("cmd=fullinit;pmirank=%s;threaded=FALSE;" % me)
    if spawned:
        got = pmi2("cmd=kvs-get;key=PARENT_ROOT_PORT_NAME;")
        mapping = pmi2("cmd=info-getjobattr;key=PMI_process_mapping;")["value"]
        print(f"child {init['rank']} of {init['size']} spawner {init['spawner-jobid']} port {got['value']} {torch} on {socket.gethostname()} map {mapping}", flush=True)
        for i in range(int(os.environ.get("CHILD_LINES", "0"))):
            print(f"child {init['rank']} line {i}", flush=True)
    else:
        # OPEN_LINE: lines, then a line left open across the spawn (see tests/tests/spawn.rs).
        before = int(os.environ.get("OPEN_LINE", "0"))
        if before:
            sys.stdout.write("".join(f"parent line {i}\n" for i in range(before)) + "parent opens a line")
            sys.stdout.flush()
        reply = pmi2(
            "cmd=spawn;thrid=t7;ncmds=1;preputcount=1;ppkey0=PARENT_ROOT_PORT_NAME;ppval0=port2;"
            f"subcmd={sys.executable};maxprocs=3;argc=2;argv0={os.path.abspath(__file__)};argv1=2;"
            f"infokeycount={len(hints)};"
            + "".join(f"infokey{i}={k};infoval{i}={v};" for i, (k, v) in enumerate(hints))
        )
        if before:
            print(" and ends it after the spawn", flush=True)
        refused = f" errmsg={reply['errmsg']}" if "errmsg" in reply else ""
        print(f"parent {me} rc={reply['rc']} thrid={reply['thrid']} jobid={reply.get('jobid', '')}{refused}", flush=True)
    assert pmi2("cmd=finalize;")["rc"] == "0"
