//! Which libraries the dynamic loader would map for a rank's program, found as glibc's
//! `ld.so` finds them for that rank, so that `super::pmix_use` judges the whole closure and
//! not the program alone.
//!
//! ```text
//!   for each library an object needs (and LD_PRELOAD's, first):
//!     a name with a slash            ──► that file
//!     the object has no DT_RUNPATH    ──► its DT_RPATH, then its loaders' up to the program
//!     LD_LIBRARY_PATH (the rank's)    ──► each directory
//!     the object's DT_RUNPATH         ──► each directory
//!     /etc/ld.so.cache                ──► the paths it names
//!     the system directories          ──► /lib/<triple>, /usr/lib/<triple>, /lib64, ...
//!   ($ORIGIN, $LIB and $PLATFORM expanded; a file built for another machine is passed over)
//! ```
//!
//! Read on the launching host: where the nodes' files differ, a library not found here makes
//! the verdict a doubt, never a "no".

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use super::elf::Dynamic;

/// The loader's cache, as `ldconfig` writes it.
const CACHE: &str = "/etc/ld.so.cache";

/// What the loader would see in a rank's environment.
#[derive(Debug, Default, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Search {
    /// `LD_LIBRARY_PATH`, split (an empty entry is the working directory).
    library_path: Vec<Vec<u8>>,
    /// `LD_PRELOAD`'s libraries.
    preload: Vec<Vec<u8>>,
    /// The rank's working directory: relative names are taken from there.
    wdir: PathBuf,
}

impl Search {
    /// The search of a rank whose environment has these values.
    pub(crate) fn new(library_path: Option<&[u8]>, preload: Option<&[u8]>, wdir: &Path) -> Search {
        let library_path = library_path
            .map(|p| p.split(|&b| b == b':' || b == b';').map(<[u8]>::to_vec).collect())
            .unwrap_or_default();
        let preload = preload
            .map(|p| {
                p.split(|&b| b == b':' || b == b' ')
                    .filter(|n| !n.is_empty())
                    .map(<[u8]>::to_vec)
                    .collect()
            })
            .unwrap_or_default();
        Search { library_path, preload, wdir: wdir.to_path_buf() }
    }
}

/// Every library name the objects of a program's closure ask for, and the first that could
/// not be found.
#[derive(Debug, Default)]
pub(crate) struct Closure {
    pub(crate) needed: Vec<Vec<u8>>,
    pub(crate) missing: Option<Vec<u8>>,
}

/// What the job's searches read, kept for its other programs: the loader's cache, and each
/// library file's dynamic section (`None`: not a library for this machine).
#[derive(Default)]
pub(crate) struct Loader {
    /// `/etc/ld.so.cache`'s bytes, read on first need (empty if it cannot be).
    cache: Option<Vec<u8>>,
    libraries: HashMap<PathBuf, Option<Rc<Dynamic>>>,
}

/// An object of the closure: where it asks the loader to look.
struct Object {
    dynamic: Rc<Dynamic>,
    /// Its `DT_RPATH` directories, expanded.
    rpath: Vec<PathBuf>,
    runpath: Option<Vec<PathBuf>>,
    /// The `DT_RPATH` directories of the objects that loaded it, up to the program.
    loaders: Rc<Vec<PathBuf>>,
}

impl Loader {
    /// The libraries `program` (at `path`) would have mapped under `search`.
    pub(crate) fn closure(
        &mut self,
        path: &Path,
        program: &Rc<Dynamic>,
        search: &Search,
    ) -> Closure {
        let mut closure = Closure::default();
        if program.needed.is_empty() {
            return closure;
        }
        // The program's $ORIGIN is where its file really is (the kernel's /proc/self/exe).
        let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let root = self.object(&real, program.clone(), &Rc::default());
        let machine = program.machine;
        let mut seen: HashSet<Vec<u8>> = HashSet::new();
        let mut queue = VecDeque::from([root]);
        // LD_PRELOAD's libraries come first, searched as the program's own.
        let mut first = Some(search.preload.clone());
        while let Some(object) = queue.pop_front() {
            let preload = first.take().unwrap_or_default();
            for name in preload.iter().chain(&object.dynamic.needed) {
                closure.needed.push(name.clone());
                if !seen.insert(name.clone()) {
                    continue;
                }
                match self.find(name, &object, search, machine) {
                    Some((found, dynamic)) => {
                        let loaders = if object.runpath.is_some() {
                            object.loaders.clone()
                        } else {
                            Rc::new([&object.rpath[..], &object.loaders[..]].concat())
                        };
                        queue.push_back(self.object(&found, dynamic, &loaders));
                    }
                    None => {
                        closure.missing.get_or_insert_with(|| name.clone());
                    }
                }
            }
        }
        closure
    }

    fn object(&self, path: &Path, dynamic: Rc<Dynamic>, loaders: &Rc<Vec<PathBuf>>) -> Object {
        let origin = path.parent().unwrap_or(Path::new("/"));
        let dirs = |list: &Option<Vec<u8>>| list.as_deref().map(|l| expand(l, origin));
        Object {
            rpath: dirs(&dynamic.rpath).unwrap_or_default(),
            runpath: dirs(&dynamic.runpath),
            dynamic,
            loaders: loaders.clone(),
        }
    }

    /// Where the loader finds `name` for `object`, and what it needs in turn.
    fn find(
        &mut self,
        name: &[u8],
        object: &Object,
        search: &Search,
        machine: u16,
    ) -> Option<(PathBuf, Rc<Dynamic>)> {
        let name_path = Path::new(OsStr::from_bytes(name));
        if name.contains(&b'/') {
            let path = search.wdir.join(name_path);
            return self.library(&path, machine).map(|d| (path, d));
        }
        let library_path: Vec<PathBuf> = search
            .library_path
            .iter()
            .map(|dir| search.wdir.join(Path::new(OsStr::from_bytes(dir))))
            .collect();
        let mut dirs: Vec<&PathBuf> = Vec::new();
        if object.runpath.is_none() {
            dirs.extend(object.rpath.iter().chain(object.loaders.iter()));
        }
        dirs.extend(&library_path);
        dirs.extend(object.runpath.iter().flatten());
        for dir in dirs {
            let path = search.wdir.join(dir).join(name_path);
            if let Some(dynamic) = self.library(&path, machine) {
                return Some((path, dynamic));
            }
        }
        let cache = self.cache.get_or_insert_with(|| std::fs::read(CACHE).unwrap_or_default());
        let cached = cache_lookup(cache, name);
        let system = system_dirs().into_iter().map(|dir| Path::new(&dir).join(name_path));
        for path in cached.into_iter().chain(system) {
            if let Some(dynamic) = self.library(&path, machine) {
                return Some((path, dynamic));
            }
        }
        None
    }

    /// The dynamic section of the library at `path`, if it is one for `machine`.
    fn library(&mut self, path: &Path, machine: u16) -> Option<Rc<Dynamic>> {
        if let Some(known) = self.libraries.get(path) {
            return known.clone().filter(|d| d.machine == machine);
        }
        let read = File::open(path).ok().and_then(|f| Dynamic::read(&f, false)).map(Rc::new);
        self.libraries.insert(path.to_path_buf(), read.clone());
        read.filter(|d| d.machine == machine)
    }
}

/// A `DT_RPATH` or `DT_RUNPATH` list, with the loader's substitutions: `$ORIGIN` (the
/// object's directory), `$PLATFORM`, and `$LIB` (Debian's `lib/<triple>` and RHEL's
/// `lib64` both, since which one this system's loader uses is not written anywhere).
fn expand(list: &[u8], origin: &Path) -> Vec<PathBuf> {
    let origin = origin.as_os_str().as_bytes();
    let triple = format!("lib/{}", triple());
    let mut dirs = Vec::new();
    for entry in list.split(|&b| b == b':' || b == b';') {
        let entry = substitute(entry, b"ORIGIN", origin);
        let entry = substitute(&entry, b"PLATFORM", std::env::consts::ARCH.as_bytes());
        for lib in [triple.as_bytes(), b"lib64"] {
            let dir = substitute(&entry, b"LIB", lib);
            let dir = PathBuf::from(OsStr::from_bytes(&dir));
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
    }
    dirs
}

/// `entry` with `$TOKEN` and `${TOKEN}` replaced by `value`.
fn substitute(entry: &[u8], token: &[u8], value: &[u8]) -> Vec<u8> {
    let braced = [b"${", token, b"}"].concat();
    let bare = [b"$", token].concat();
    let mut out = Vec::with_capacity(entry.len());
    let mut rest = entry;
    while !rest.is_empty() {
        if rest.starts_with(&braced) {
            out.extend_from_slice(value);
            rest = &rest[braced.len()..];
        } else if rest.starts_with(&bare)
            && !rest.get(bare.len()).is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
        {
            out.extend_from_slice(value);
            rest = &rest[bare.len()..];
        } else {
            out.push(rest[0]);
            rest = &rest[1..];
        }
    }
    out
}

/// The multiarch triple of this machine's libraries (Debian's layout).
fn triple() -> String {
    format!("{}-linux-gnu", std::env::consts::ARCH)
}

/// The loader's built-in directories, after its cache.
fn system_dirs() -> Vec<String> {
    let triple = triple();
    let mut dirs = vec![format!("/lib/{triple}"), format!("/usr/lib/{triple}")];
    dirs.extend(["/lib64", "/usr/lib64", "/lib", "/usr/lib"].map(String::from));
    dirs
}

/// The paths glibc's cache (`glibc-ld.so.cache1.1`, after the old format's table if there
/// is one) gives for the library `name`, in the cache's order. Scanned, not indexed: one
/// lookup or a few per job (docs/measurements.md, *The loader's cache*).
fn cache_lookup(cache: &[u8], name: &[u8]) -> Vec<PathBuf> {
    const MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
    let Some(start) = cache.windows(MAGIC.len()).position(|w| w == MAGIC) else {
        return Vec::new();
    };
    let new = &cache[start..];
    let u32_at = |at: usize| new.get(at..at + 4).map(|b| u32::from_le_bytes(b.try_into().unwrap()));
    // Header: magic and version, nlibs, len_strings, flags, extension, unused: 48 bytes.
    let Some(count) = u32_at(20) else { return Vec::new() };
    // Entries of 24 bytes: flags, key, value (offsets into the header's block), osversion,
    // hwcap.
    let string = |at: u32| {
        let rest = new.get(at as usize..)?;
        Some(&rest[..rest.iter().position(|&b| b == 0)?])
    };
    let mut paths = Vec::new();
    for entry in (0..count as usize).map(|i| 48 + i * 24) {
        let (Some(key), Some(value)) = (u32_at(entry + 4), u32_at(entry + 8)) else { break };
        if string(key) == Some(name) {
            if let Some(path) = string(value) {
                paths.push(PathBuf::from(OsStr::from_bytes(path)));
            }
        }
    }
    paths
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_expanded_as_the_loader_does() {
        let origin = Path::new("/opt/app/bin");
        assert_eq!(expand(b"$ORIGIN/../lib", origin), [PathBuf::from("/opt/app/bin/../lib")]);
        assert_eq!(expand(b"${ORIGIN}/lib:/x", origin).len(), 2);
        // `$ORIGINAL` is not `$ORIGIN` followed by "AL".
        assert_eq!(expand(b"/a/$ORIGINAL", origin), [PathBuf::from("/a/$ORIGINAL")]);
        let lib = expand(b"/usr/$LIB", origin);
        assert_eq!(lib, [PathBuf::from(format!("/usr/lib/{}", triple())), "/usr/lib64".into()]);
    }

    #[test]
    fn this_systems_cache_names_libc() {
        let cache = std::fs::read(CACHE).unwrap();
        let libc = cache_lookup(&cache, b"libc.so.6");
        assert!(libc.iter().any(|p| p.is_file()), "{libc:?}");
        assert_eq!(cache_lookup(&cache, b"libc.so.6\0"), Vec::<PathBuf>::new());
        let cut = &cache[..cache.len() / 2];
        assert!(cache_lookup(cut, b"libc.so.6").len() <= 1, "cut short, and no panic");
        assert_eq!(cache_lookup(b"garbage", b"libc.so.6"), Vec::<PathBuf>::new());
    }

    #[test]
    fn libc_is_found_and_its_loader_with_it() {
        let true_ = File::open("/bin/true").unwrap();
        let program = Rc::new(Dynamic::read(&true_, true).unwrap());
        let closure =
            Loader::default().closure(Path::new("/bin/true"), &program, &Search::default());
        assert_eq!(closure.missing, None);
        assert!(closure.needed.contains(&b"libc.so.6".to_vec()), "{:?}", closure.needed);
        assert!(closure.needed.iter().any(|n| n.starts_with(b"ld-linux")), "{:?}", closure.needed);
    }
}
