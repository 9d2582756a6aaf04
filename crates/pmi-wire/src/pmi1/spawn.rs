//! `mcmd=spawn` blocks (docs/pmi.md, *Spawn*): one executable of an `MPI_Comm_spawn[_multiple]` call
//! each, written as `key=value` lines up to `endcmd`, in several writes.

use std::collections::HashMap;

use super::{missing, take_line, to_number, Pmi1Error, Request, MAX_BLOCK};

/// One `mcmd=spawn` block: one executable of an `MPI_Comm_spawn[_multiple]` call.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SpawnBlock {
    pub nprocs: u32,
    pub execname: String,
    /// Number of blocks (executables) in this spawn.
    pub totspawns: u32,
    /// 1-based index of this block; the spawn is complete when it equals `totspawns`.
    pub spawnssofar: u32,
    /// `arg1`.. in order; each is a whole line, spaces and `=` included.
    pub args: Vec<String>,
    /// Pairs to store in the new job's KVS before its ranks start.
    pub preput: Vec<(String, String)>,
    /// `MPI_Info` hints (Hydra honours path, wdir, host, hosts, hostfile).
    pub info: Vec<(String, String)>,
}

/// Reads a `mcmd=` block up to its `endcmd` line. Every line obeys the line limit, and the
/// whole block the block limit, so a client that never sends `endcmd` cannot make us buffer
/// without bound.
pub(super) fn parse_block(buf: &[u8]) -> Result<Option<(Request, usize)>, Pmi1Error> {
    let mut lines = Vec::new();
    let mut pos = 0;
    loop {
        let (text, used) = match take_line(&buf[pos..]) {
            Ok(Some(line)) => line,
            Ok(None) if buf.len() >= MAX_BLOCK => return Err(Pmi1Error::BlockTooLarge),
            Ok(None) => return Ok(None),
            Err(e) => return Err(e),
        };
        pos += used;
        if pos > MAX_BLOCK {
            return Err(Pmi1Error::BlockTooLarge);
        }
        if text == "endcmd" {
            break;
        }
        // Every other line is key=value: refuse garbage now rather than at `endcmd`.
        if !text.contains('=') {
            let name = lines.first().and_then(|l: &&str| l.strip_prefix("mcmd=")).unwrap_or("");
            return Err(Pmi1Error::NoEquals { cmd: name.to_string(), token: text.to_string() });
        }
        lines.push(text);
    }
    // The first line is there: the block starts with "mcmd=".
    let name = lines.first().and_then(|l| l.strip_prefix("mcmd=")).unwrap_or("");
    if name.is_empty() {
        return Err(Pmi1Error::EmptyCommand);
    }
    if name != "spawn" {
        let raw = std::str::from_utf8(&buf[..pos - 1]).map_err(|_| Pmi1Error::NotUtf8)?;
        return Ok(Some((Request::Unknown { cmd: name.to_string(), raw: raw.to_string() }, pos)));
    }
    // The first occurrence of a key wins, as in Hydra; a map keeps argN lookups linear.
    let mut fields = HashMap::new();
    for (k, v) in lines[1..].iter().filter_map(|line| line.split_once('=')) {
        fields.entry(k).or_insert(v);
    }
    Ok(Some((Request::Spawn(Box::new(spawn_from_fields(&fields)?)), pos)))
}

fn spawn_from_fields(fields: &HashMap<&str, &str>) -> Result<SpawnBlock, Pmi1Error> {
    let get = |key: &str| fields.get(key).copied().ok_or_else(|| missing("spawn", key));
    let number = |key: &str| get(key).and_then(|v| to_number::<u32>("spawn", key, v));
    // Counts default to zero: MPICH always sends them, but nothing is lost without them.
    let count = |key: &str| if fields.contains_key(key) { number(key) } else { Ok(0) };
    let pairs = |n: u32, key: &str, val: &str| {
        (0..n)
            .map(|i| {
                Ok((get(&format!("{key}{i}"))?.to_string(), get(&format!("{val}{i}"))?.to_string()))
            })
            .collect::<Result<Vec<_>, Pmi1Error>>()
    };
    Ok(SpawnBlock {
        nprocs: number("nprocs")?,
        execname: get("execname")?.to_string(),
        totspawns: number("totspawns")?,
        spawnssofar: number("spawnssofar")?,
        args: (1..=count("argcnt")?)
            .map(|i| get(&format!("arg{i}")).map(str::to_string))
            .collect::<Result<_, _>>()?,
        preput: pairs(count("preput_num")?, "preput_key_", "preput_val_")?,
        info: pairs(count("info_num")?, "info_key_", "info_val_")?,
    })
}

impl SpawnBlock {
    /// The block in the order `simple_pmi.c` writes it, without the final newline.
    pub(super) fn encode_lines(&self) -> String {
        let mut lines = vec![
            "mcmd=spawn".to_string(),
            format!("nprocs={}", self.nprocs),
            format!("execname={}", self.execname),
            format!("totspawns={}", self.totspawns),
            format!("spawnssofar={}", self.spawnssofar),
        ];
        lines.extend(self.args.iter().enumerate().map(|(i, a)| format!("arg{}={a}", i + 1)));
        lines.push(format!("argcnt={}", self.args.len()));
        lines.push(format!("preput_num={}", self.preput.len()));
        for (i, (k, v)) in self.preput.iter().enumerate() {
            lines.push(format!("preput_key_{i}={k}"));
            lines.push(format!("preput_val_{i}={v}"));
        }
        lines.push(format!("info_num={}", self.info.len()));
        for (i, (k, v)) in self.info.iter().enumerate() {
            lines.push(format!("info_key_{i}={k}"));
            lines.push(format!("info_val_{i}={v}"));
        }
        lines.push("endcmd".to_string());
        lines.join("\n")
    }
}
