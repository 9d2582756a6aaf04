//! Bounded, deterministic fuzzing of every decoder in pmi-wire and rlaunch-protocol.
//!
//! A corpus of valid PMI-1 lines, spawn blocks, PMI-2 frames and control frames is mutated
//! (bit flips, truncation, insertion, deletion, splicing) and fed to each decoder. The
//! properties: nothing panics, a decoded message never claims more bytes than it was given,
//! and whatever decodes re-encodes to something that decodes to the same value. Decoded
//! requests also go through the protocol-neutral mapping ([`pmi_wire::request`]), a spawn's
//! blocks gathered across messages as a connection gathers them.
//!
//! The same properties are the cargo-fuzz targets' (fuzz/, run to millions of executions by
//! hand: README "Reliability in figures", docs/reliability.md); their corpora and any crash
//! they found replay in the launcher's test of every target's corpus
//! (crates/launcher/tests/fuzz_corpus.rs).
//!
//! `RLAUNCH_FUZZ_ITERS=<n>` changes the number of mutated inputs (default 100000); the seed is
//! fixed so a failure reproduces.

use pmi_wire::{pmi1, pmi2};
use rlaunch_protocol::control::{
    self, Binding, Bootstrap, CpuUnit, Down, DownFrame, Frame, GpuBind, Gpus, Job, Launch,
    LinkDown, LinkUp, Liveness, Mapping, NodePlan, RankPlan, Segment, StdinTarget, Up, UpFrame,
};
use rlaunch_protocol::ids::{ExitOutcome, Gid, Stream};

/// The properties, shared with the cargo-fuzz targets in fuzz/.
mod properties;

/// xorshift64*: tiny, deterministic, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn iterations() -> usize {
    std::env::var("RLAUNCH_FUZZ_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000)
}

fn pmi2_frame(body: &str, right: bool) -> Vec<u8> {
    let header = if right { format!("{:>6}", body.len()) } else { format!("{:<6}", body.len()) };
    format!("{header}{body}").into_bytes()
}

fn corpus() -> Vec<Vec<u8>> {
    let mut c: Vec<Vec<u8>> = [
        "cmd=init pmi_version=1 pmi_subversion=1\n",
        "cmd=init pmi_version=2 pmi_subversion=0\n",
        "cmd=get_maxes\n",
        "cmd=get_appnum\n",
        "cmd=get_my_kvsname\n",
        "cmd=get_universe_size\n",
        "cmd=put kvsname=kvs_7601_0_1545258719_vm key=-bcast-1-0 value=2F6465762F73686D\n",
        "cmd=put kvsname=k key=big value=segments=2\n",
        "cmd=get kvsname=kvs_7601_0_1545258719_vm key=PMI_process_mapping\n",
        "cmd=barrier_in\n",
        "cmd=finalize\n",
        "cmd=abort exitcode=42\n",
        "cmd=publish_name service=S port=P\n",
        "cmd=unpublish_name service=S\n",
        "cmd=lookup_name service=S\n",
        "cmd=initack pmiid=1\n",
        "cmd=frobnicate a=b\n",
        "mcmd=spawn\nnprocs=2\nexecname=/usr/bin/python3\ntotspawns=1\nspawnssofar=1\n\
         arg1=/path/pmi1_raw_client.py\narg2=child\narg3=arg with space\nargcnt=3\npreput_num=1\n\
         preput_key_0=PARENT_ROOT_PORT_NAME\npreput_val_0=port\ninfo_num=1\ninfo_key_0=wdir\n\
         info_val_0=/some/dir\nendcmd\n",
        "mcmd=spawn\nnprocs=1\nexecname=a\ntotspawns=2\nspawnssofar=2\nargcnt=0\npreput_num=0\n\
         info_num=0\nendcmd\n",
        // Replies, for parse_response.
        "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n",
        "cmd=get_result rc=-1 msg=key_k_not_found value=unknown\n",
        "cmd=initack\n",
        "cmd=set size=2\n",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();

    for (i, body) in [
        "cmd=fullinit;pmirank=0;threaded=FALSE;",
        "cmd=job-getid;",
        "cmd=info-getjobattr;key=PMI_process_mapping;",
        "cmd=kvs-put;key=k;value=card;;of;;rank=0;",
        "cmd=kvs-fence;thrid=0x1;",
        "cmd=kvs-get;jobid=J;srcid=1;key=k;",
        "cmd=info-putnodeattr;key=k;value=v;",
        "cmd=info-getnodeattr;key=k;wait=TRUE;",
        "cmd=name-publish;name=S;port=P;infokeycount=1;infokey0=a;infoval0=b;",
        "cmd=name-lookup;name=S;infokeycount=0;",
        "cmd=name-unpublish;name=S;infokeycount=0;",
        "cmd=spawn;ncmds=2;preputcount=1;ppkey0=k;ppval0=v;subcmd=/bin/a;maxprocs=2;argc=2;\
         argv0=x;argv1=y;infokeycount=1;infokey0=wdir;infoval0=/tmp;subcmd=/bin/b;maxprocs=1;\
         argc=0;infokeycount=0;",
        "cmd=abort;isworld=TRUE;msg=it broke;;badly;",
        "cmd=job-connect;jobid=J;",
        "cmd=job-disconnect;jobid=J;",
        "cmd=finalize;",
        "cmd=fullinit-response;pmi-version=2;pmi-subversion=0;rank=0;size=2;appnum=0;\
         debugged=FALSE;pmiverbose=FALSE;rc=0;",
    ]
    .iter()
    .enumerate()
    {
        c.push(pmi2_frame(body, i % 2 == 0));
    }

    let up = [
        Up::Output { rank: Gid(3), stream: Stream::Stdout, data: b"hello\n".to_vec() },
        Up::RankExited {
            rank: Gid(1),
            pid: 99,
            outcome: ExitOutcome::Signaled(9),
            unfinalized: false,
            usage: Default::default(),
        },
        Up::ProxyLost { host: "n2".into(), reason: "ssh died".into(), came_up: true },
        Up::FenceIn { epoch: 1, pairs: vec![("k".into(), "v".into())] },
    ];
    for msg in up {
        let mut buf = Vec::new();
        msg.encode(&mut buf);
        c.push(buf);
    }
    let launch = Launch {
        job: Job {
            jobid: "kvs_1".into(),
            size: 2,
            segments: vec![Segment {
                exe: b"./a".to_vec(),
                args: vec![b"x".to_vec()],
                inherit_env: true,
                env: vec![(b"A".to_vec(), b"1".to_vec())],
                wdir: b"/tmp".to_vec(),
            }],
            env: vec![],
            stdin: StdinTarget::Rank(0),
            kill_grace_ms: 500,
            bootstrap: Bootstrap::Fork,
            process_mapping: Some("(vector,(0,1,2))".into()),
            pmi_port: false,
            mapping: Some(Mapping { unit: CpuUnit::L3, per: Some(2) }),
            binding: Some(Binding { unit: CpuUnit::Core, count: 2 }),
            spread: false,
            gpus: Some(Gpus { per_rank: vec![1], bind: GpuBind::Map(vec![3, 2]), share: false }),
            liveness: Liveness::default(),
            pmix: None,
            progress: false,
            forked_ranks: 2,
            rendezvous: None,
            nodes: 1,
            tracker: None,
            slurm_nodes: None,
            report_vars: false,
            restart: 1,
            max_restarts: 2,
            goes_on: true,
            adoption: Some(rlaunch_protocol::control::Adoption {
                address: "127.0.0.1:9".into(),
                secret: [7; 32],
            }),
            bcast: Some(rlaunch_protocol::control::Bcast {
                files: vec![rlaunch_protocol::control::BcastFile {
                    dest: "bin/app".into(),
                    size: 3,
                    mode: 0o755,
                    crc: 0x352441c2,
                    programs: vec![0],
                }],
                base: Some("/scratch/%h".into()),
            }),
        },
        node: NodePlan {
            index: rlaunch_protocol::ids::NodeId(0),
            host: "n1".into(),
            fork: true,
            ranks: vec![RankPlan { rank: 0, segment: 0 }, RankPlan { rank: 1, segment: 0 }],
            children: vec![],
        },
        late: false,
        top: false,
    };
    let down = [
        Down::Launch(Box::new(launch)),
        Down::Stdin { seq: 1, data: b"input".to_vec() },
        Down::Signal { signo: 15 },
        Down::Terminate { grace_ms: 100 },
        Down::Resend,
        Down::BcastData { offset: 512 << 10, data: b"abc".to_vec().into() },
    ];
    for msg in down {
        let mut buf = Vec::new();
        msg.encode(&mut buf);
        c.push(buf);
    }
    // The link's own messages, both ways.
    let link_up = [
        LinkUp::Greeting { host: "n1".into(), pid: 7 },
        LinkUp::Ping,
        LinkUp::ClockEcho { sent: 1, at: 2 },
    ];
    for msg in link_up {
        let mut buf = Vec::new();
        msg.encode(&mut buf);
        c.push(buf);
    }
    let link_down = [
        LinkDown::Ping,
        LinkDown::Credit { bytes: 1 << 20 },
        LinkDown::ClockProbe { sent: 3 },
        LinkDown::Redirect { to: "10.0.0.1:4242".into() },
    ];
    for msg in link_down {
        let mut buf = Vec::new();
        msg.encode(&mut buf);
        c.push(buf);
    }
    c.push(control::hello().to_vec());
    c
}

/// Bytes that steer parsers into their interesting branches.
const TOKENS: &[&[u8]] = &[
    b"\n",
    b" ",
    b"=",
    b";",
    b";;",
    b"cmd=",
    b"mcmd=spawn\n",
    b"endcmd\n",
    b"argcnt=99\n",
    b"ncmds=",
    b"subcmd=",
    b"999999",
    b"  65 ",
    b"\xff",
    b"\0",
    b"\x7fRLAUNCH",
];

fn mutate(rng: &mut Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut buf = corpus[rng.below(corpus.len())].clone();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(buf.len() + 1);
        match rng.below(7) {
            0 if !buf.is_empty() => {
                let i = rng.below(buf.len());
                buf[i] ^= 1 << rng.below(8);
            }
            1 => buf.truncate(at),
            2 => buf.insert(at, rng.next() as u8),
            3 => {
                let token = TOKENS[rng.below(TOKENS.len())];
                buf.splice(at..at, token.iter().copied());
            }
            4 if !buf.is_empty() => {
                let end = (at + 1 + rng.below(8)).min(buf.len());
                buf.drain(at.min(end)..end);
            }
            5 => {
                // Splice: the head of this input and the tail of another.
                let other = &corpus[rng.below(corpus.len())];
                let from = rng.below(other.len() + 1);
                buf.truncate(at);
                buf.extend_from_slice(&other[from..]);
            }
            _ => {
                // Two messages back to back, so that consumption counts matter.
                let other = &corpus[rng.below(corpus.len())];
                buf.extend_from_slice(other);
            }
        }
    }
    buf
}

/// Runs every decoder on `input` and checks the properties in the module doc.
fn check(input: &[u8]) {
    properties::pmi1(input);
    properties::pmi2(input);
    properties::control(input);
}

#[test]
fn corpus_is_valid_and_every_prefix_is_incomplete() {
    for item in corpus() {
        let whole = |r: Option<usize>| r == Some(item.len());
        let decoded = whole(pmi1::parse_request(&item).ok().flatten().map(|(_, n)| n))
            || whole(pmi1::parse_response(&item).ok().flatten().map(|(_, n)| n))
            || whole(pmi2::parse_frame(&item).ok().flatten().map(|(_, n)| n))
            || whole(control::decode::<UpFrame>(&item).ok().flatten().map(|(_, n)| n))
            || whole(control::decode::<DownFrame>(&item).ok().flatten().map(|(_, n)| n))
            || whole(control::scan_hello(&item).ok().flatten().map(|f| f.consumed));
        assert!(decoded, "corpus item does not decode: {item:?}");
        for cut in 0..item.len() {
            let prefix = &item[..cut];
            assert!(!matches!(pmi1::parse_request(prefix), Ok(Some(_))), "{prefix:?}");
            assert!(!matches!(pmi2::parse_frame(prefix), Ok(Some(_))), "{prefix:?}");
            check(prefix);
        }
    }
}

#[test]
fn mutated_inputs_never_panic_or_overrun() {
    let corpus = corpus();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..iterations() {
        let input = mutate(&mut rng, &corpus);
        check(&input);
    }
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = Rng(0xdead_beef_cafe_f00d);
    for _ in 0..iterations() / 4 {
        let len = rng.below(64);
        let input: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        check(&input);
    }
}

/// Writes the corpus above as the cargo-fuzz targets' seeds (fuzz/corpus/TARGET/seed-N):
/// `cargo test -p rlaunch-protocol --test fuzz_codecs -- --ignored write_fuzz_seeds`.
#[test]
#[ignore = "writes files under fuzz/; run by hand when the corpus changes"]
fn write_fuzz_seeds() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
    for target in ["pmi1", "pmi2", "control"] {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).expect("the corpus directory");
        for (i, item) in corpus().iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i}")), item).expect("a seed file");
        }
    }
}
