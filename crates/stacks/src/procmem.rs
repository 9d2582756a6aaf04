//! Reading another process's memory through /proc/PID/mem, with a small page cache so that
//! word-by-word reads from the unwinder cost one pread per page.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

const PAGE: u64 = 4096;

pub(crate) struct ProcMem {
    file: File,
    pages: HashMap<u64, Option<Box<[u8]>>>,
}

impl ProcMem {
    pub fn open(pid: i32) -> std::io::Result<ProcMem> {
        Ok(ProcMem { file: File::open(format!("/proc/{pid}/mem"))?, pages: HashMap::new() })
    }

    fn page(&mut self, base: u64) -> Option<&[u8]> {
        let file = &self.file;
        self.pages
            .entry(base)
            .or_insert_with(|| {
                let mut buf = vec![0u8; PAGE as usize];
                match file.read_at(&mut buf, base) {
                    Ok(n) if n == PAGE as usize => Some(buf.into_boxed_slice()),
                    _ => None,
                }
            })
            .as_deref()
    }

    pub fn read_u64(&mut self, addr: u64) -> Option<u64> {
        if !addr.is_multiple_of(8) {
            let mut b = [0u8; 8];
            return self.read_exact(addr, &mut b).then(|| u64::from_le_bytes(b));
        }
        let base = addr & !(PAGE - 1);
        let off = (addr - base) as usize;
        let p = self.page(base)?;
        Some(u64::from_le_bytes(p[off..off + 8].try_into().unwrap()))
    }

    /// Uncached read of a byte range (used e.g. to copy the vDSO image).
    pub fn read_exact(&self, addr: u64, buf: &mut [u8]) -> bool {
        matches!(self.file.read_at(buf, addr), Ok(n) if n == buf.len())
    }
}
