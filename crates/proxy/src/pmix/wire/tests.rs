use super::*;

/// A host message, built the way host.c builds it.
fn host_message(tag: u8, fields: &[&[u8]]) -> Vec<u8> {
    let mut body = vec![tag];
    fields.iter().for_each(|f| body.extend_from_slice(f));
    body
}

fn blob(b: &[u8]) -> Vec<u8> {
    let mut v = (b.len() as u32).to_le_bytes().to_vec();
    v.extend_from_slice(b);
    v
}

#[test]
fn commands_carry_their_length() {
    let m = Command::OpDone { id: 7, status: ERR_NOT_FOUND }.encode();
    assert_eq!(u32::from_le_bytes(m[..4].try_into().unwrap()) as usize, m.len() - 4);
    assert_eq!(m[4], 4);
    assert_eq!(&m[5..9], &7u32.to_le_bytes());
    assert_eq!(&m[9..13], &(-46i32).to_le_bytes());
}

fn u32le(v: u32) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

fn strs(items: &[&str]) -> Vec<u8> {
    let mut v = u32le(items.len() as u32);
    items.iter().for_each(|s| v.extend(blob(s.as_bytes())));
    v
}

fn proc(nspace: &str, rank: u32) -> Proc {
    Proc { nspace: nspace.into(), rank }
}

#[test]
fn events_decode_as_the_host_writes_them() {
    let env = host_message(
        103,
        &[
            &blob(b"job"),
            &3u32.to_le_bytes(),
            &0i32.to_le_bytes(),
            &2u32.to_le_bytes(),
            &blob(b"A=1"),
            &blob(b"B=2"),
        ],
    );
    assert_eq!(
        Event::decode(&env),
        Ok(Event::Env {
            nspace: "job".into(),
            rank: 3,
            status: 0,
            vars: vec![b"A=1".to_vec(), b"B=2".to_vec()]
        })
    );
    let fence = host_message(
        104,
        &[&u32le(1), &u32le(1), &u32le(1), &blob(b"job"), &u32le(RANK_WILDCARD), &blob(b"xy")],
    );
    let procs = vec![proc("job", RANK_WILDCARD)];
    assert_eq!(
        Event::decode(&fence),
        Ok(Event::Fence { id: 1, collect: true, procs, data: b"xy".to_vec() })
    );
}

#[test]
fn published_values_keep_their_kind() {
    let publish = host_message(
        106,
        &[
            &u32le(4),
            &blob(b"job_1"),
            &u32le(1),
            &u32le(1),
            &u32le(2),
            &blob(b"port:accept"),
            &u32le(0),
            &blob(b"0:1"),
            &blob(b"cid"),
            &u32le(1),
            &blob(&[0, 7, 255]),
        ],
    );
    assert_eq!(
        Event::decode(&publish),
        Ok(Event::Publish {
            id: 4,
            proc: proc("job_1", 1),
            once: true,
            pairs: vec![
                ("port:accept".into(), NameValue::Text("0:1".into())),
                ("cid".into(), NameValue::Packed(vec![0, 7, 255])),
            ],
        })
    );
    let done = Command::LookupDone {
        id: 9,
        status: SUCCESS,
        found: vec![("cid".into(), NameValue::Packed(vec![1, 2]), u32::MAX)],
    }
    .encode();
    let want = [
        &u32le(9)[..],
        &0i32.to_le_bytes(),
        &u32le(1),
        &blob(b"cid"),
        &u32le(1),
        &blob(&[1, 2]),
        &u32le(u32::MAX),
    ]
    .concat();
    assert_eq!(&done[5..], &want[..]);
    let bad = host_message(
        106,
        &[
            &u32le(4),
            &blob(b"j"),
            &u32le(1),
            &u32le(0),
            &u32le(1),
            &blob(b"k"),
            &u32le(7),
            &blob(b""),
        ],
    );
    assert_eq!(Event::decode(&bad), Err(WireError::UnknownValue(7)));
}

#[test]
fn lookups_say_how_long_they_wait() {
    let lookup = |wait: u32, secs: u32| {
        let m = host_message(
            107,
            &[&u32le(2), &blob(b"job"), &u32le(0), &u32le(wait), &u32le(secs), &strs(&["k"])],
        );
        match Event::decode(&m) {
            Ok(Event::Lookup { id: 2, proc: p, wait, keys }) => {
                assert_eq!((p, keys), (proc("job", 0), vec!["k".to_string()]));
                wait
            }
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(lookup(0, 600), LookupWait::No);
    assert_eq!(lookup(1, 0), LookupWait::UntilJobEnd);
    assert_eq!(lookup(1, 600), LookupWait::For { ms: 600_000 });
}

#[test]
fn a_spawn_carries_each_application_whole() {
    let spawn = host_message(
        115,
        &[
            &u32le(5),
            &blob(b"job"),
            &u32le(1),
            &u32le(1),
            &blob(b"/bin/child"),
            &strs(&["child", "-x"]),
            &strs(&["OMPI_PARENT_PORT=p"]),
            &u32le(2),
            &u32le(1),
            &blob(b"pmix.wdir"),
            &blob(b"/tmp"),
        ],
    );
    let app = App {
        cmd: "/bin/child".into(),
        argv: vec!["child".into(), "-x".into()],
        env: vec!["OMPI_PARENT_PORT=p".into()],
        maxprocs: 2,
        info: vec![("pmix.wdir".into(), "/tmp".into())],
    };
    assert_eq!(
        Event::decode(&spawn),
        Ok(Event::Spawn { id: 5, proc: proc("job", 1), apps: vec![app] })
    );
    for cut in 1..spawn.len() {
        assert!(Event::decode(&spawn[..cut]).is_err(), "cut at {cut}");
    }
    let done = Command::SpawnDone { id: 5, status: SUCCESS, nspace: "job_1".into() }.encode();
    assert_eq!(done[4], 8);
    let sync = Command::Sync { id: 3 }.encode();
    assert_eq!(sync, [5, 0, 0, 0, 9, 3, 0, 0, 0]);
    assert_eq!(Event::decode(&[116, 3, 0, 0, 0]), Ok(Event::Synced { id: 3 }));
    assert_eq!(&done[5..], &[&u32le(5)[..], &0i32.to_le_bytes(), &blob(b"job_1")].concat()[..]);
}

#[test]
fn direct_modex_requests_name_the_process_and_answers_carry_the_blob() {
    let ask = host_message(111, &[&u32le(3), &blob(b"job_1"), &u32le(2)]);
    assert_eq!(Event::decode(&ask), Ok(Event::Dmodex { id: 3, proc: proc("job_1", 2) }));
    let lost = host_message(117, &[&blob(b"job_1"), &u32le(2)]);
    assert_eq!(Event::decode(&lost), Ok(Event::Lost { proc: proc("job_1", 2) }));
    let data = host_message(112, &[&u32le(9), &(-46i32).to_le_bytes(), &blob(b"xy")]);
    assert_eq!(
        Event::decode(&data),
        Ok(Event::DmodexData { id: 9, status: ERR_NOT_FOUND, data: b"xy".to_vec() })
    );
    for cut in 1..data.len() {
        assert!(Event::decode(&data[..cut]).is_err(), "cut at {cut}");
    }
    let m = Command::DmodexAsk { id: 4, nspace: "job".into(), rank: 1 }.encode();
    assert_eq!(m[4], 7);
    assert_eq!(&m[5..], &[&u32le(4)[..], &blob(b"job"), &u32le(1)].concat()[..]);
    // As host.c's dead() reads it: the namespace, a count, the ranks.
    let m = Command::Dead { nspace: "job".into(), ranks: vec![1, 5] }.encode();
    assert_eq!(m[4], 10);
    assert_eq!(&m[5..], &[&blob(b"job")[..], &u32le(2), &u32le(1), &u32le(5)].concat()[..]);
}

#[test]
fn cut_or_unknown_messages_are_errors_not_panics() {
    let env = host_message(
        103,
        &[&blob(b"job"), &3u32.to_le_bytes(), &0i32.to_le_bytes(), &u32::MAX.to_le_bytes()],
    );
    assert_eq!(Event::decode(&env), Err(WireError::Short));
    let fence = host_message(104, &[&u32le(1), &u32le(1), &u32le(0), &blob(b"xy")]);
    for cut in 0..fence.len() {
        assert!(Event::decode(&fence[..cut]).is_err(), "cut at {cut}");
    }
    assert_eq!(Event::decode(&[99]), Err(WireError::UnknownTag(99)));
}
