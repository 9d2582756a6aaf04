//! `rlaunch-proxy`: started by rlaunch or by a parent proxy, never by hand. Its stdin and
//! stdout are the control channel to its parent.

use rlaunch_proxy::fdio::FdStream;

fn main() {
    rlaunch_proxy::tune_malloc();
    rlaunch_proxy::procs::cloexec_inherited_fds();
    rlaunch_proxy::init_logging("rlaunch-proxy");
    let (input, output) = match rlaunch_proxy::take_stdio_channel() {
        Ok(fds) => fds,
        Err(e) => {
            eprintln!("rlaunch-proxy: cannot take the control channel from stdin/stdout: {e}");
            std::process::exit(1);
        }
    };
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    let code = runtime.block_on(async {
        let channel = FdStream::new(input).and_then(|i| Ok((i, FdStream::new(output)?)));
        match channel {
            Ok((up_in, up_out)) => rlaunch_proxy::node::serve(up_in, up_out).await,
            Err(e) => {
                eprintln!("rlaunch-proxy: the control channel is not a pipe or socket: {e}");
                1
            }
        }
    });
    std::process::exit(code);
}
