use super::*;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

/// How long a chunk that must not come is waited for.
const QUIET: Duration = Duration::from_millis(200);
/// How long a chunk that must come may take, on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(5);

/// The next carried chunk the hub queues within `wait`.
async fn next_chunk(data: &mut mpsc::UnboundedReceiver<Queued>, wait: Duration) -> Option<Carried> {
    loop {
        let queued = tokio::time::timeout(wait, data.recv()).await.ok()??;
        if let Queued { up: Up::Output { .. }, carried: Some(c), .. } = queued {
            return Some(c);
        }
    }
}

#[tokio::test]
async fn a_carried_pipe_is_read_again_once_its_chunk_went_up_and_the_channel_has_room() {
    // The channel up, and its far end.
    let (up, mut far) = UnixStream::pair().unwrap();
    nix::sys::socket::setsockopt(&up, nix::sys::socket::sockopt::SndBuf, &(256 << 10)).unwrap();
    up.set_nonblocking(true).unwrap();
    let upstream = splice::target(up.as_raw_fd()).expect("a socket takes splices");
    let carrying = Carrying { carriers: Carriers::new(), upstream };
    let (data_tx, mut data) = mpsc::unbounded_channel();
    let outputs = Outputs::start(data_tx, Some(carrying), None, |_| {}).unwrap();
    let (out_r, out_w) = splice::pipe(0).unwrap();
    let (err_r, _err_w) = splice::pipe(0).unwrap();
    rlaunch_tree::fdio::enlarge_pipe(&out_w, 1 << 20);
    // SAFETY: F_GETPIPE_SZ on an open pipe.
    let size = unsafe { libc::fcntl(out_w.as_raw_fd(), libc::F_GETPIPE_SZ) };
    assert_eq!(size, 1 << 20, "the rank's pipe holds the writes below without blocking");
    outputs.add(Gid(0), 0, Up::StdoutClosed, out_r, err_r);
    let mut rank = File::from(out_w);
    let block = vec![b'x'; 64 << 10];

    rank.write_all(&block).unwrap();
    let mut first = next_chunk(&mut data, PATIENCE).await.expect("the write is carried");
    assert_eq!(first.len(), 64 << 10);
    // While the chunk is queued, however much the rank writes, its pipe is not read.
    for _ in 0..3 {
        rank.write_all(&block).unwrap();
    }
    assert!(next_chunk(&mut data, QUIET).await.is_none());

    // The chunk goes up into a channel with room: the three writes come as one chunk.
    while !first.is_empty() {
        first.splice_into(up.as_raw_fd()).unwrap();
    }
    drop(first);
    let second = next_chunk(&mut data, PATIENCE).await.expect("read again");
    assert_eq!(second.len(), 3 * (64 << 10));
    let mut got = vec![0; 64 << 10];
    far.read_exact(&mut got).unwrap();
    assert!(got.iter().all(|&c| c == b'x'));

    // A channel that stays full holds a pipe back only for a moment: it is shared, and
    // others may keep it full.
    let junk = [0u8; 4096];
    while (&up).write(&junk).is_ok() {}
    assert_eq!(second.into_bytes().unwrap().len(), 3 * (64 << 10));
    rank.write_all(&block).unwrap();
    let third = next_chunk(&mut data, PATIENCE).await.expect("read again, room or not");
    assert_eq!(third.len(), 64 << 10);
}

/// The next frame the hub queues within `wait`, output debts repaid at once.
async fn next_up(data: &mut mpsc::UnboundedReceiver<Queued>, wait: Duration) -> Option<Up> {
    let queued = tokio::time::timeout(wait, data.recv()).await.ok()??;
    Some(queued.up)
}

/// A new rank's pipes (read ends, for the hub) and its stdout's write end.
fn rank_pipes() -> (OwnedFd, OwnedFd, File, OwnedFd) {
    let (out_r, out_w) = splice::pipe(0).unwrap();
    let (err_r, err_w) = splice::pipe(0).unwrap();
    rlaunch_tree::fdio::enlarge_pipe(&out_w, 1 << 20);
    (out_r, err_r, File::from(out_w), err_w)
}

/// A hub that writes a lone rank's output into `stdout` (a 64 KiB pipe nobody reads yet)
/// itself, and that rank, added (its first frame taken): its stdout's write end, and its
/// stderr's.
struct Lone {
    stdout: File,
    data: mpsc::UnboundedReceiver<Queued>,
    outputs: Outputs,
    rank: File,
    rank_err: OwnedFd,
}

async fn lone_rank() -> Lone {
    let (stdout, sink) = splice::pipe(0).unwrap();
    let (data_tx, mut data) = mpsc::unbounded_channel();
    let outputs = Outputs::start(data_tx, None, Some(sink), |_| {}).unwrap();
    let (out_r, err_r, rank, rank_err) = rank_pipes();
    outputs.add(Gid(0), 0, Up::StdoutClosed, out_r, err_r);
    assert!(matches!(next_up(&mut data, PATIENCE).await, Some(Up::StdoutClosed)));
    Lone { stdout: File::from(stdout), data, outputs, rank, rank_err }
}

/// Lines of 11 bytes, 220,000 in all: more than rlaunch's stdout here takes.
fn many_lines() -> Vec<u8> {
    (0..20000).flat_map(|i| format!("line {i:05}\n").into_bytes()).collect()
}

#[tokio::test]
async fn a_rank_added_while_the_lone_rank_is_mid_move_waits_and_stdout_is_handed_back_whole() {
    let Lone { mut stdout, mut data, outputs, rank: mut lone, rank_err: _lone_err } =
        lone_rank().await;
    let lines = many_lines();
    lone.write_all(&lines).unwrap();
    lone.write_all(b"open").unwrap();
    // The move stalls on the full stdout; none of it goes up.
    assert!(next_up(&mut data, QUIET).await.is_none());

    // A spawned rank: held, nothing of it goes up while the move is under way.
    let (out_r, err_r, mut child, _child_err) = rank_pipes();
    let started = Up::RankStarted { rank: Gid(1), pid: 1, cpus: None, gpus: None };
    outputs.add(Gid(1), 1, started, out_r, err_r);
    child.write_all(b"child line\n").unwrap();
    assert!(next_up(&mut data, QUIET).await.is_none());

    // stdout drains: the lines arrive whole and in order, then the line start goes up first,
    // then the child is added, and its output goes up.
    let mut got = vec![0; lines.len()];
    let reader = std::thread::spawn(move || {
        stdout.read_exact(&mut got).unwrap();
        (got, stdout)
    });
    let first = next_up(&mut data, PATIENCE).await;
    assert!(
        matches!(&first, Some(Up::Output { rank: Gid(0), data, .. }) if data == b"open"),
        "{first:?}"
    );
    assert!(matches!(
        next_up(&mut data, PATIENCE).await,
        Some(Up::RankStarted { rank: Gid(1), .. })
    ));
    let child_out = next_up(&mut data, PATIENCE).await;
    assert!(
        matches!(&child_out, Some(Up::Output { rank: Gid(1), data, .. }) if data == b"child line\n")
    );
    let (got, mut stdout) = reader.join().unwrap();
    assert!(got == lines, "the lines differ");
    // The lone rank is relayed now, like the child.
    lone.write_all(b" ends\n").unwrap();
    let more = next_up(&mut data, PATIENCE).await;
    assert!(
        matches!(&more, Some(Up::Output { rank: Gid(0), data, .. }) if data == b" ends\n"),
        "{more:?}"
    );
    rlaunch_tree::fdio::set_nonblocking(&stdout).unwrap();
    assert!(stdout.read(&mut [0; 16]).is_err(), "nothing more went into stdout");
}

/// CPU time this thread has used so far: the test's, and its runtime's tasks' (one thread).
fn cpu_time() -> Duration {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_THREAD).unwrap();
    let tv =
        |t: nix::sys::time::TimeVal| Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000);
    tv(usage.user_time()) + tv(usage.system_time())
}

#[tokio::test]
async fn a_lone_rank_that_ends_while_stdout_is_full_is_waited_for_quietly_and_loses_nothing() {
    let Lone { mut stdout, mut data, outputs: _outputs, rank: mut lone, rank_err: lone_err } =
        lone_rank().await;
    // Lines, then 10 KiB with no newline (taken by copying), and the rank ends.
    let mut written = many_lines();
    written.extend(std::iter::repeat_n(b'x', 10 << 10));
    lone.write_all(&written).unwrap();
    drop((lone, lone_err));
    // stdout (64 KiB) is full and stays so: the hub waits for room without spinning.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = cpu_time();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let spent = cpu_time() - before;
    assert!(spent < Duration::from_millis(100), "{spent:?} of CPU time while waiting");
    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        let mut buf = vec![0; 1 << 16];
        while got.len() < written.len() {
            match stdout.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        (got, written)
    });
    // The end goes up once everything is in stdout.
    loop {
        match next_up(&mut data, PATIENCE).await {
            Some(Up::OutputEnd { rank: Gid(0), stream: Stream::Stdout }) => break,
            Some(_) => {}
            None => panic!("the end of the stream did not come"),
        }
    }
    let (got, written) = reader.join().unwrap();
    assert!(got == written, "the bytes differ");
}
