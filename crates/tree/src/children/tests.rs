use super::*;

// pid -1: nothing real is ever signalled.
fn child() -> ChildState {
    ChildState::new("n2".into(), -1, "its proxy")
}

#[test]
fn a_child_that_said_done_is_not_lost_whatever_the_order() {
    let mut c = child();
    c.done = true;
    assert_eq!(c.on_exit(ExitOutcome::Exited(0)), None);
    assert_eq!(c.on_link_closed(None), None);
    assert!(c.settled());
}

#[test]
fn a_child_is_lost_once_both_its_link_and_its_process_are_gone() {
    let mut c = child();
    assert_eq!(c.on_link_closed(None), None, "its exit tells the story: wait for it");
    c.add_stderr(b"ssh: connect to host n2: No route to host\n\n");
    let lost = c.on_exit(ExitOutcome::Exited(255)).unwrap();
    assert_eq!(lost.host, "n2");
    assert_eq!(
        lost.reason,
        "its proxy exited with code 255: ssh: connect to host n2: No route to host"
    );
    assert!(c.settled());
    assert_eq!(c.on_exit(ExitOutcome::Exited(255)), None, "lost once");
}

#[test]
fn a_broken_link_says_more_than_the_exit() {
    let mut c = child();
    let lost = c.on_link_closed(Some("no word from it for 10 s".into())).unwrap();
    assert_eq!(lost.reason, "no word from it for 10 s");
    assert!(!c.settled(), "its process has not been reaped yet");
    assert_eq!(c.on_exit(ExitOutcome::Signaled(9)), None);
    assert!(c.settled());
}

/// A real process, stopped as by `kill -STOP`: only SIGKILL ends it.
fn stopped_process() -> std::process::Child {
    let child = std::process::Command::new("sleep").arg("60").spawn().unwrap();
    procs::signal_pid(child.id() as i32, Signal::SIGSTOP);
    child
}

fn killed(mut child: std::process::Child) -> bool {
    use std::os::unix::process::ExitStatusExt;
    child.wait().unwrap().signal() == Some(Signal::SIGKILL as i32)
}

#[test]
fn a_done_child_whose_link_breaks_has_its_process_killed() {
    let process = stopped_process();
    let mut c = ChildState::new("n2".into(), process.id() as i32, "its proxy");
    c.done = true;
    assert_eq!(c.on_link_closed(Some("no word from it for 1.5 s".into())), None);
    assert!(killed(process));
    assert_eq!(c.on_exit(ExitOutcome::Signaled(9)), None, "done: not lost");
    assert!(c.settled());
}

#[test]
fn a_process_that_outlives_its_clean_close_is_killed_after_the_grace_and_lost() {
    let process = stopped_process();
    let mut c = ChildState::new("n2".into(), process.id() as i32, "its proxy");
    assert_eq!(c.on_link_closed(None), None, "its exit tells the story: wait for it");
    let closed = c.lingers_since.expect("lingering");
    let grace = Duration::from_secs(5);
    c.kill_if_lingering(grace, closed + Duration::from_secs(4));
    assert!(c.lingers_since.is_some(), "within its grace");
    c.kill_if_lingering(grace, closed + grace);
    assert!(killed(process));
    let lost = c.on_exit(ExitOutcome::Signaled(9)).unwrap();
    assert_eq!(lost.reason, "it closed its connection, but its proxy did not end within 5 s");
    assert!(c.settled());
}

#[test]
fn a_child_that_never_started_is_settled_and_lost() {
    let c = ChildState::failed("n3".into());
    assert!(c.settled() && c.lost);
}
