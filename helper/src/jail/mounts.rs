//! The sandbox's root: a read-only tmpfs holding exactly the plan's mounts.
//!
//! Bind sources are the descriptors the broker opened (as the requester) and
//! sent with the plan; each is cloned with `open_tree` before anything is
//! mounted, so a source under the staging directory (a workspace in /tmp,
//! say) stays reachable. The kernel clones only mounts of the caller's own
//! mount namespace and the descriptors are the host's: a system broker
//! clones them itself and sends the trees instead (`JailPlan::sends_trees`);
//! a helper of a broker that is not root looks each path up again in its
//! copy of the namespace and clones it only if it is the very file the
//! descriptor is. The new root and the overlays' layers are assembled side
//! by side in one staging tmpfs of the old root: detaching the old root after
//! `pivot_root` takes the layers' mounts with it, in one unmount (each
//! unmount waits for an expedited RCU grace period, which interrupts every
//! CPU). Attributes (read-only, nosuid, nodev) are set on each detached
//! copy, recursively, before it is attached: the sandbox never sees a
//! writable moment of a read-only bind.

use super::error::{self, Context, Result, fail};
use super::fds::Descriptors;
use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, OFlag, OpenHow, ResolveFlag, open, openat2};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::stat::{Mode, SFlag, fstat};
use nix::unistd::{chdir, mkdir, pivot_root, symlinkat};
use palisade_protocol::{
    DEV_LINKS, DEV_NODES, DEV_PTS, DEV_SHM, HelperRecord, JailPlan, Mount, Stage, tmpfs_inodes,
};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A tmpfs mounted over the old root's `/tmp`: it holds the new root and,
/// next to it, the overlays' layers; after `pivot_root` none of it shows.
const STAGING: &str = "/tmp";
/// The staging tmpfs holds mount points and empty files to mount on, nothing else.
const STAGING_OPTIONS: &str = "size=1m,mode=0755";
/// The new root: a directory of the staging tmpfs, bound on itself.
const NEW_ROOT: &str = "/tmp/root";
/// /dev's own tmpfs holds device mount points and symlinks only (it ends up read-only).
const DEV_OPTIONS: &str = "size=64k,mode=0755";

/// The part of the root no plan changes, built by a warm sandbox before
/// its plan: the staging tmpfs, the new root bound on itself, `/proc`, and
/// `/dev` but for its `/dev/shm` (whose size is the plan's). Only a plan
/// with those two where they are here, and nothing of its own in them, is
/// admitted (`WarmSpec::admits`). The staging tmpfs covers the old root's
/// `/tmp`, where bind sources may live: the old `/tmp` is held open, and
/// such sources are looked up through it.
pub struct Ahead {
    old_tmp: OwnedFd,
    /// Where the old `/tmp` is on the host (a symlink's target, if it is one).
    tmp_path: String,
}

pub fn build_ahead() -> Result<Ahead> {
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let old_tmp = open(STAGING, flags, Mode::empty()).at(Stage::Mounts, || format!("open {STAGING}"))?;
    let link = std::fs::read_link(format!("/proc/self/fd/{}", old_tmp.as_raw_fd()));
    let tmp_path = link.at(Stage::Mounts, || format!("find where {STAGING} is"))?;
    let tmp_path = (tmp_path.to_str().map(str::to_string))
        .ok_or_else(|| fail(Stage::Mounts, Errno::EINVAL, format!("{STAGING} is {tmp_path:?}, not UTF-8")))?;
    let nodes = dev_nodes()?;
    stage_new_root()?;
    place(&Mount::Proc { target: "/proc".into() }, Source::None)?;
    build_dev("dev", "/dev", nodes)?;
    // Nothing of it propagates anywhere (the device nodes' copies were
    // slaves of the host's); the rest of the namespace still receives the
    // host's new mounts until the plan.
    mount(None::<&str>, STAGING, None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .at(Stage::Mounts, || "make the staging tmpfs private".into())?;
    Ok(Ahead { old_tmp, tmp_path })
}

impl Ahead {
    /// `path` relative to the old `/tmp` (`.` for itself), if it is under it.
    fn under_tmp(&self, path: &str) -> Option<String> {
        let rest = path.strip_prefix(self.tmp_path.as_str())?;
        (rest.is_empty() || rest.starts_with('/')).then(|| format!(".{rest}"))
    }

    /// Whether a recursive copy of `path` would hold the staging tmpfs: the
    /// old `/tmp` and every directory above it (a cold sandbox copies its
    /// sources before the staging tmpfs is mounted; the broker sends such
    /// plans to a cold one).
    fn holds_staging(&self, path: &str) -> bool {
        path == "/"
            || self.tmp_path.strip_prefix(path).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }
}

/// The root from the plan's mounts: a system broker's trees of its binds
/// and overlays ([`JailPlan::captured`]) are attached as they came; anything
/// else is cloned here, from this namespace's copy of the host's. With the
/// shared part built `ahead`, only the plan's own part is left.
pub fn build_root(plan: &JailPlan, descriptors: Option<Descriptors>, ahead: Option<Ahead>) -> Result<()> {
    let mut descriptors = descriptors.ok_or_else(|| fail(Stage::Plan, Errno::EINVAL, "no descriptors"))?;
    let (mut trees, captured) = (descriptors.rest().into_iter(), plan.captured().collect::<Vec<_>>());
    // Targets were checked with the plan: each resolves inside the new root, as written.
    let mounts = &plan.mounts;
    // Nothing mounted from here on may propagate back to the host.
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .at(Stage::Mounts, || "make / private".into())?;
    let mut tree = || trees.next().ok_or_else(|| fail(Stage::Plan, Errno::EINVAL, "no tree"));
    let sources = (mounts.iter().enumerate())
        .map(|(i, m)| match (captured.contains(&i), m) {
            // An overlay's layer on disk comes after its lower layer.
            (true, Mount::Overlay { layer: Some(_), .. }) => Ok(Source::Layered(tree()?, tree()?)),
            (true, _) => tree().map(Source::Tree),
            (false, Mount::Dev { .. } | Mount::Proc { .. }) if ahead.is_some() => Ok(Source::Ahead),
            (false, _) => capture(plan, &descriptors, m, ahead.as_ref()),
        })
        .collect::<Result<Vec<_>>>()?;
    let built_ahead = ahead.is_some();
    drop((descriptors, ahead));
    match built_ahead {
        true => chdir(NEW_ROOT).at(Stage::Mounts, || "chdir to the new root".into())?,
        false => stage_new_root()?,
    }
    for (i, (m, source)) in mounts.iter().zip(sources).enumerate() {
        match (m, source) {
            (Mount::Overlay { target, size_bytes, .. }, Source::Tree(lower)) => {
                overlay(target, Upper::Tmpfs(*size_bytes), lower, i)?
            }
            (Mount::Overlay { target, .. }, Source::Layered(lower, layer)) => {
                overlay(target, Upper::Layer(layer), lower, i)?
            }
            (Mount::File { target, contents }, _) => file(target, contents, i)?,
            (Mount::Dev { target, shm_bytes }, Source::Ahead) => {
                finish_dev(&target[1..], target, *shm_bytes)?
            }
            (Mount::Proc { .. }, Source::Ahead) => {}
            (m, source) => place(m, source)?,
        }
    }
    // Nothing in the root itself is writable: writable places are explicit mounts.
    set_attributes(None, ".", libc::MOUNT_ATTR_RDONLY, false)
        .at(Stage::Mounts, || "make / read-only".into())?;
    // Swap roots: the old root ends up stacked on the new one, then is
    // detached, the staging tmpfs and the overlays' layers with it.
    pivot_root(".", ".").at(Stage::Mounts, || "pivot_root".into())?;
    umount2(".", MntFlags::MNT_DETACH).at(Stage::Mounts, || "detach the old root".into())?;
    chdir("/").at(Stage::Mounts, || "chdir /".into())
}

/// A staging tmpfs over the old root's `/tmp`, and in it the new root
/// bound on itself (`pivot_root` wants a mount point) as the current directory.
fn stage_new_root() -> Result<()> {
    let fs_flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    mount(Some("tmpfs"), STAGING, Some("tmpfs"), fs_flags, Some(STAGING_OPTIONS))
        .at(Stage::Mounts, || "mount the staging tmpfs".into())?;
    mkdir(NEW_ROOT, Mode::from_bits_truncate(0o755)).at(Stage::Mounts, || format!("mkdir {NEW_ROOT}"))?;
    mount(Some(NEW_ROOT), NEW_ROOT, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .at(Stage::Mounts, || "bind the new root on itself".into())?;
    chdir(NEW_ROOT).at(Stage::Mounts, || "chdir to the new root".into())
}

enum Source {
    None,
    Tree(OwnedFd),
    /// An overlay's lower layer and its layer on disk.
    Layered(OwnedFd, OwnedFd),
    DevNodes(Vec<OwnedFd>),
    /// Built before the plan ([`build_ahead`]).
    Ahead,
}

fn capture(plan: &JailPlan, descriptors: &Descriptors, m: &Mount, ahead: Option<&Ahead>) -> Result<Source> {
    Ok(match m {
        Mount::Bind { source, .. } | Mount::Overlay { source, .. } => {
            let fd = descriptors.get(source, Stage::Mounts)?;
            let host_layout = plan.descriptor(source).is_some_and(|i| plan.descriptors[i].host_layout);
            let tree = clone_same(source, fd, host_layout, ahead)?;
            match m {
                Mount::Overlay { layer: Some(layer), .. } => {
                    let fd = descriptors.get(layer, Stage::Mounts)?;
                    Source::Layered(tree, clone_same(layer, fd, false, ahead)?)
                }
                _ => Source::Tree(tree),
            }
        }
        Mount::Dev { .. } => Source::DevNodes(dev_nodes()?),
        _ => Source::None,
    })
}

/// A helper that is not root cannot clone the host's mount behind `fd` (the
/// kernel clones mounts of the caller's own namespace only: EINVAL). It
/// looks `path` up in its copy of the namespace, with no magic link (and, for
/// a path the request named, no symlink) on the way, and clones what it finds
/// only if it is the file the broker opened: same device, same inode. A path
/// swapped since is refused, never followed. With the staging tmpfs built
/// `ahead` over `/tmp`, a path under it is looked up from the old `/tmp`.
fn clone_same(path: &str, fd: &OwnedFd, host_layout: bool, ahead: Option<&Ahead>) -> Result<OwnedFd> {
    let mut resolve = ResolveFlag::RESOLVE_NO_MAGICLINKS;
    if !host_layout {
        resolve |= ResolveFlag::RESOLVE_NO_SYMLINKS;
    }
    let how = OpenHow::new().flags(OFlag::O_PATH | OFlag::O_CLOEXEC).resolve(resolve);
    if ahead.is_some_and(|a| a.holds_staging(path)) {
        let why =
            format!("{path} holds the staging tmpfs of a sandbox built ahead: only a cold one can bind it");
        return Err(fail(Stage::Mounts, Errno::EINVAL, why));
    }
    let under_tmp = ahead.and_then(|a| a.under_tmp(path).map(|rest| (&a.old_tmp, rest)));
    let found = match &under_tmp {
        Some((tmp, rest)) => openat2(tmp, rest.as_str(), how),
        None => openat2(AT_FDCWD, path, how),
    };
    let via = if under_tmp.is_some() { " (through the /tmp held since the sandbox was built)" } else { "" };
    let found = found.at(Stage::Mounts, || format!("look up {path} again{via}"))?;
    let (want, got) = (fstat(fd), fstat(&found));
    let (want, got) = (
        want.at(Stage::Mounts, || format!("stat {path}"))?,
        got.at(Stage::Mounts, || format!("stat {path}"))?,
    );
    if (want.st_dev, want.st_ino) != (got.st_dev, got.st_ino) {
        let why = format!("{path} changed since the broker opened it{via}");
        return Err(fail(Stage::Mounts, Errno::ESTALE, why));
    }
    clone_tree(&found, path)
}

fn place(m: &Mount, source: Source) -> Result<()> {
    let rel = &m.target()[1..];
    let nosuid_nodev = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
    match (m, source) {
        (Mount::Bind { source, target, writable, .. }, Source::Tree(tree)) => {
            let is_dir = fstat(&tree).map(|st| SFlag::from_bits_truncate(st.st_mode) == SFlag::S_IFDIR);
            make_mount_point(rel, is_dir.at(Stage::Mounts, || format!("stat {source}"))?)?;
            let ro = if *writable { 0 } else { libc::MOUNT_ATTR_RDONLY };
            let how = if *writable { "read-write" } else { "read-only" };
            set_attributes(Some(&tree), "", nosuid_nodev | ro, true)
                .at(Stage::Mounts, || format!("mount {target} {how}"))?;
            attach(&tree, rel).at(Stage::Mounts, || format!("mount {source} on {target} {how}"))
        }
        (Mount::Tmpfs { target, size_bytes, mode }, _) => {
            make_mount_point(rel, true)?;
            let data = format!("size={size_bytes},nr_inodes={},mode={mode:o}", tmpfs_inodes(*size_bytes));
            mount(
                Some("tmpfs"),
                rel,
                Some("tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some(data.as_str()),
            )
            .at(Stage::Mounts, || format!("mount tmpfs on {target}"))
        }
        (Mount::Proc { target }, _) => {
            make_mount_point(rel, true)?;
            let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
            mount(Some("proc"), rel, Some("proc"), flags, None::<&str>)
                .at(Stage::Mounts, || format!("mount proc on {target}"))
        }
        (Mount::Dev { target, shm_bytes }, Source::DevNodes(nodes)) => {
            build_dev(rel, target, nodes)?;
            finish_dev(rel, target, *shm_bytes)
        }
        (Mount::Symlink { target, link }, _) => {
            make_parents(rel)?;
            symlinkat(link.as_str(), nix::fcntl::AT_FDCWD, rel)
                .at(Stage::Mounts, || format!("symlink {target} -> {link}"))
        }
        _ => Err(fail(Stage::Mounts, Errno::EINVAL, format!("no source captured for {}", m.target()))),
    }
}

/// Where an overlay's writes go.
enum Upper {
    /// A tmpfs of this many bytes, handed to the broker after the mount.
    Tmpfs(u64),
    /// The broker's directory on disk (its `upper` and `work` made empty),
    /// which the broker bounds and reads itself.
    Layer(OwnedFd),
}

/// The run's writes to the host directory under `target` go to an upper
/// layer, never to the host directory: a tmpfs (the host's disk untouched,
/// a disk-fill ends at its size), whose directory fd the broker receives, or
/// the broker's layer on disk. The layers are mounted in the staging tmpfs,
/// outside the new root: the sandbox never sees them, and they are detached
/// with the old root.
fn overlay(target: &str, upper: Upper, lower: OwnedFd, i: usize) -> Result<()> {
    // Relative to the new root, the current directory.
    let stage = format!("../overlay-{i}");
    let (low, rw) = (format!("{stage}/lower"), format!("{stage}/rw"));
    make_mount_point(&low, true)?;
    make_mount_point(&rw, true)?;
    let nosuid_nodev = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
    set_attributes(Some(&lower), "", libc::MOUNT_ATTR_RDONLY | nosuid_nodev, true)
        .at(Stage::Mounts, || format!("make the lower layer of {target} read-only"))?;
    attach(&lower, &low).at(Stage::Mounts, || format!("attach the lower layer of {target}"))?;
    let fs_flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    let tmpfs = match upper {
        Upper::Layer(layer) => {
            set_attributes(Some(&layer), "", nosuid_nodev, true)
                .at(Stage::Mounts, || format!("make the upper layer of {target} nosuid, nodev"))?;
            attach(&layer, &rw).at(Stage::Mounts, || format!("attach the upper layer of {target}"))?;
            false
        }
        Upper::Tmpfs(size) => {
            let data = format!("size={size},nr_inodes={},mode=0755", tmpfs_inodes(size));
            mount(Some("tmpfs"), rw.as_str(), Some("tmpfs"), fs_flags, Some(data.as_str()))
                .at(Stage::Mounts, || format!("mount the upper tmpfs of {target}"))?;
            for d in ["upper", "work"] {
                mkdir(format!("{rw}/{d}").as_str(), Mode::from_bits_truncate(0o755))
                    .at(Stage::Mounts, || format!("mkdir {rw}/{d}"))?;
            }
            true
        }
    };
    let rel = &target[1..];
    make_mount_point(rel, true)?;
    let layers = format!("{STAGING}/overlay-{i}");
    let data =
        format!("lowerdir={layers}/lower,upperdir={layers}/rw/upper,workdir={layers}/rw/work,userxattr");
    mount(Some("overlay"), rel, Some("overlay"), fs_flags, Some(data.as_str()))
        .at(Stage::Mounts, || format!("mount an overlay on {target}"))
        .map_err(|mut e| {
            if e.errno == Errno::ENODEV {
                e.message.push_str(" (this kernel has no overlay filesystem: load the overlay module, or set disk = \"direct\")");
            }
            e
        })?;
    if !tmpfs {
        return Ok(());
    }
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let upper = open(format!("{rw}/upper").as_str(), flags, Mode::empty())
        .at(Stage::Mounts, || format!("open the upper layer of {target}"))?;
    error::send_with_fds(&HelperRecord::Overlay { target: target.to_string() }, &[upper.as_raw_fd()])
        .at(Stage::Mounts, || format!("hand the upper layer of {target} to the broker"))
}

/// A file of the plan's own: written in the staging tmpfs, outside the new
/// root, and bound read-only (nosuid, nodev, noexec) over `target`. A target
/// that cannot be made (in a read-only bind that lacks it) or bound is an
/// error: the sandbox never runs with what was there instead.
fn file(target: &str, contents: &str, i: usize) -> Result<()> {
    use std::io::Write;
    // Relative to the new root, the current directory.
    let staged = format!("../file-{i}");
    let flags = OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW;
    let fd = open(staged.as_str(), flags, Mode::from_bits_truncate(0o644))
        .at(Stage::Mounts, || format!("create the file for {target}"))?;
    std::fs::File::from(fd)
        .write_all(contents.as_bytes())
        .at(Stage::Mounts, || format!("write the file for {target}"))?;
    let tree = open_tree(&staged, false)?;
    let ro =
        libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV | libc::MOUNT_ATTR_NOEXEC;
    set_attributes(Some(&tree), "", ro, false).at(Stage::Mounts, || format!("make {target} read-only"))?;
    let rel = &target[1..];
    // A file already there (in the read-only /etc snapshot) is the mount point.
    let is_file =
        nix::sys::stat::lstat(rel).is_ok_and(|st| SFlag::from_bits_truncate(st.st_mode) == SFlag::S_IFREG);
    if !is_file {
        make_mount_point(rel, false).map_err(|mut e| {
            e.message.push_str(" (the sandbox's root has no file there to bind the plan's over)");
            e
        })?;
    }
    attach(&tree, rel).at(Stage::Mounts, || format!("bind the plan's file on {target}"))
}

/// Copies of the host's harmless device nodes, to bind into /dev.
fn dev_nodes() -> Result<Vec<OwnedFd>> {
    DEV_NODES.iter().map(|n| open_tree(&format!("/dev/{n}"), false)).collect()
}

/// A tmpfs with the host's harmless device nodes bound in and a private
/// devpts; [`finish_dev`] adds /dev/shm and makes the tmpfs read-only.
fn build_dev(rel: &str, target: &str, nodes: Vec<OwnedFd>) -> Result<()> {
    make_mount_point(rel, true)?;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC;
    mount(Some("tmpfs"), rel, Some("tmpfs"), flags, Some(DEV_OPTIONS))
        .at(Stage::Mounts, || format!("mount tmpfs on {target}"))?;
    for (name, node) in DEV_NODES.iter().zip(nodes) {
        let path = format!("{rel}/{name}");
        make_mount_point(&path, false)?;
        set_attributes(Some(&node), "", libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NOEXEC, false)
            .at(Stage::Mounts, || format!("mount {target}/{name} nosuid,noexec"))?;
        attach(&node, &path).at(Stage::Mounts, || format!("bind /dev/{name} on {target}/{name}"))?;
    }
    for (name, link) in DEV_LINKS {
        symlinkat(link, nix::fcntl::AT_FDCWD, format!("{rel}/{name}").as_str())
            .at(Stage::Mounts, || format!("symlink {target}/{name} -> {link}"))?;
    }
    let (shm_dir, pts) = (format!("{rel}/{DEV_SHM}"), format!("{rel}/{DEV_PTS}"));
    make_mount_point(&shm_dir, true)?;
    make_mount_point(&pts, true)?;
    mount(Some("devpts"), pts.as_str(), Some("devpts"), flags, Some("newinstance,ptmxmode=0666,mode=0620"))
        .at(Stage::Mounts, || format!("mount devpts on {target}/{DEV_PTS}"))
}

/// A writable /dev/shm of `shm` bytes, then the rest of /dev read-only.
fn finish_dev(rel: &str, target: &str, shm: u64) -> Result<()> {
    let shm_dir = format!("{rel}/{DEV_SHM}");
    let data = format!("size={shm},nr_inodes={},mode=1777", tmpfs_inodes(shm));
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC | MsFlags::MS_NODEV;
    mount(Some("tmpfs"), shm_dir.as_str(), Some("tmpfs"), flags, Some(data.as_str()))
        .at(Stage::Mounts, || format!("mount tmpfs on {target}/{DEV_SHM}"))?;
    set_attributes(None, rel, libc::MOUNT_ATTR_RDONLY, false)
        .at(Stage::Mounts, || format!("make {target} read-only"))
}

fn make_parents(rel: &str) -> Result<()> {
    let mut path = String::with_capacity(rel.len());
    for component in rel.split('/').take(rel.split('/').count() - 1) {
        if !path.is_empty() {
            path.push('/');
        }
        path.push_str(component);
        match mkdir(path.as_str(), Mode::from_bits_truncate(0o755)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(e).at(Stage::Mounts, || format!("mkdir /{path}")),
        }
    }
    Ok(())
}

/// Creates a directory or an empty file to mount on, unless it exists.
fn make_mount_point(rel: &str, dir: bool) -> Result<()> {
    make_parents(rel)?;
    let made = if dir {
        mkdir(rel, Mode::from_bits_truncate(0o755))
    } else {
        // Exclusive: opening an overlay's file for writing would copy it up.
        let flags = OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW;
        open(rel, flags, Mode::from_bits_truncate(0o644)).map(drop)
    };
    match made {
        Ok(()) | Err(Errno::EEXIST) => Ok(()),
        Err(e) => Err(e).at(Stage::Mounts, || format!("create mount point /{rel}")),
    }
}

fn cstr(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| fail(Stage::Mounts, Errno::EINVAL, format!("NUL byte in path {s:?}")))
}

/// A detached copy of the mount at `path` (and, if `recursive`, below it):
/// for the fixed device nodes of /dev, which no request names.
fn open_tree(path: &str, recursive: bool) -> Result<OwnedFd> {
    let c = cstr(path)?;
    let mut flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC;
    if recursive {
        flags |= libc::AT_RECURSIVE as u32;
    }
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c.as_ptr(), flags) };
    let fd = Errno::result(fd).at(Stage::Mounts, || format!("capture {path} for binding"))?;
    // SAFETY: open_tree returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A detached copy of the tree at the descriptor `fd` and below it (`path`
/// names it in errors only).
fn clone_tree(fd: &OwnedFd, path: &str) -> Result<OwnedFd> {
    let flags = libc::OPEN_TREE_CLONE
        | libc::OPEN_TREE_CLOEXEC
        | libc::AT_RECURSIVE as u32
        | libc::AT_EMPTY_PATH as u32;
    // SAFETY: `fd` is open and the empty path is a valid NUL-terminated string.
    let tree = unsafe { libc::syscall(libc::SYS_open_tree, fd.as_raw_fd(), c"".as_ptr(), flags) };
    let tree = Errno::result(tree).at(Stage::Mounts, || format!("capture {path} for binding"))?;
    // SAFETY: open_tree returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(tree as i32) })
}

/// Attaches a detached tree at `rel` (relative to the staging root).
fn attach(tree: &OwnedFd, rel: &str) -> nix::Result<()> {
    let to = CString::new(rel).map_err(|_| Errno::EINVAL)?;
    let empty = c"";
    // SAFETY: both strings are valid and NUL-terminated; `tree` is an open descriptor.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    Errno::result(rc).map(drop)
}

/// Sets mount attributes on `path` (relative to `dir`, or the cwd).
fn set_attributes(dir: Option<&OwnedFd>, path: &str, set: u64, recursive: bool) -> nix::Result<()> {
    let c = CString::new(path).map_err(|_| Errno::EINVAL)?;
    let mut flags = if path.is_empty() { libc::AT_EMPTY_PATH } else { 0 };
    if recursive {
        flags |= libc::AT_RECURSIVE;
    }
    let attr = libc::mount_attr { attr_set: set, attr_clr: 0, propagation: 0, userns_fd: 0 };
    let dirfd = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    // SAFETY: `c` and `attr` are valid for the duration of the call and `attr`'s size is passed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dirfd,
            c.as_ptr(),
            flags,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    Errno::result(rc).map(drop)
}
