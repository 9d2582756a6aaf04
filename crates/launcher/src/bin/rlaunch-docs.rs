//! `rlaunch-docs man` writes rlaunch's manual page, `rlaunch-docs completions SHELL` its
//! completion script for bash, zsh or fish, both from rlaunch's option table: what `make
//! install` puts beside the binaries.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let out = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["man"] => Some(rlaunch::docs::manual()),
        ["completions", shell] => rlaunch::docs::completions(shell),
        _ => None,
    };
    match out {
        Some(text) => print!("{text}"),
        None => {
            eprintln!("usage: rlaunch-docs man | rlaunch-docs completions bash|zsh|fish");
            std::process::exit(2);
        }
    }
}
