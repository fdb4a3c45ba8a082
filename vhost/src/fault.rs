//! Surviving a frontend's memory that loses its backing (issue 27).
//!
//! A frontend's memory table maps its files (memfds, hugetlbfs files)
//! shared into the daemon. A page of such a mapping has no backing when the
//! frontend shrinks the file (`ftruncate`) after `SET_MEM_TABLE`, when a
//! hugetlb file's pool runs dry (the daemon maps with `MAP_NORESERVE`), or
//! on a hardware memory error; the kernel then answers the daemon's access
//! with `SIGBUS` (mmap(2), "Errors: SIGBUS"), which by default ends the
//! process and every function with it. [`crate::backend`] refuses a table
//! whose regions run past the end of their files, but a file can shrink
//! after the check (an unsealed memfd: `F_SEAL_SHRINK` is the frontend's to
//! set), so the daemon also recovers from the fault itself.
//!
//! The guest-memory work of a thread runs inside [`catch`]. A `SIGBUS`
//! raised by an access inside it is answered the way Wayland compositors
//! answer a client's shrunk `wl_shm` pool (libwayland's
//! `wl_shm_buffer_begin_access`): the handler maps a private anonymous
//! (zero) page over the faulting page, `MAP_FIXED`, notes the address for
//! the thread and returns, and the access completes against the zero
//! page. [`catch`] then reports the [`Fault`]; the caller treats the
//! memory of the function it belongs to as lost (its device reset, its
//! connection closed: `DataPath::memory_fault`). Anywhere else a `SIGBUS`
//! goes to the handler that was there before (Rust's runtime, or the
//! default action: the process ends, as it should for a fault in the
//! daemon's own memory).
//!
//! On Linux x86-64 and aarch64 a `SIGBUS` comes only from file-backed or
//! hugetlb mappings and memory errors, never from the daemon's heap or
//! stacks, and inside [`catch`] the only such mappings touched are the
//! frontends' memory: so a fault inside [`catch`] is always a frontend's.

use std::cell::Cell;
use std::sync::atomic::{compiler_fence, AtomicUsize, Ordering};
use std::sync::Once;

/// A `SIGBUS` caught inside [`catch`]: the first faulting address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// The address the access faulted at (`si_addr`), in the daemon's
    /// address space.
    pub addr: usize,
}

thread_local! {
    /// Depth of [`catch`] scopes on this thread (a `SIGBUS` is recovered
    /// only inside one).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// First address that faulted in the innermost scope; 0 for none.
    static FAULTED: Cell<usize> = const { Cell::new(0) };
}

/// The `SIGBUS` action found when the handler was installed
/// (`sa_sigaction` and `sa_flags`), to pass faults outside [`catch`] on.
static PREV_HANDLER: AtomicUsize = AtomicUsize::new(libc::SIG_DFL);
static PREV_FLAGS: AtomicUsize = AtomicUsize::new(0);
static INSTALL: Once = Once::new();

/// Page sizes tried for the replacement mapping, smallest first: a
/// hugetlb mapping can only be replaced a whole huge page at a time.
const PAGE_SIZES: [usize; 3] = [4 << 10, 2 << 20, 1 << 30];

/// Runs `f`, recovering from a `SIGBUS` any access inside it raises (see
/// the module). Returns `f`'s value and the first fault, if one was
/// raised. Scopes nest: a fault is reported by the innermost scope only.
pub fn catch<R>(f: impl FnOnce() -> R) -> (R, Option<Fault>) {
    install();
    let outer = FAULTED.with(|c| c.replace(0));
    DEPTH.with(|d| d.set(d.get() + 1));
    // The handler runs on this thread, between any two instructions of
    // `f`: the scope must be visible to it before `f`'s first access.
    compiler_fence(Ordering::SeqCst);
    // The depth is restored also when `f` unwinds (the worker catches
    // engine panics outside this scope).
    struct Leave(usize);
    impl Drop for Leave {
        fn drop(&mut self) {
            compiler_fence(Ordering::SeqCst);
            DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
            FAULTED.with(|c| c.set(self.0));
        }
    }
    let leave = Leave(outer);
    let r = f();
    compiler_fence(Ordering::SeqCst);
    let fault = FAULTED.with(|c| c.get());
    drop(leave);
    (r, (fault != 0).then_some(Fault { addr: fault }))
}

/// Whether the calling thread is inside [`catch`].
pub fn in_scope() -> bool {
    DEPTH.with(|d| d.get() > 0)
}

/// Installs the handler, once per process.
fn install() {
    INSTALL.call_once(|| {
        // SAFETY: a zeroed `sigaction` is a valid value of the C struct;
        // `sigaction(2)` reads `act` and writes `old`, both valid for the
        // call. The handler only touches this module's thread-locals and
        // atomics and makes async-signal-safe system calls (mmap(2),
        // sigaction(2)).
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_sigbus as *const () as usize;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut act.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, &act, &mut old) != 0 {
                tracing::error!(
                    "cannot install the SIGBUS handler: a frontend's shrunk memory ends the daemon"
                );
                return;
            }
            PREV_HANDLER.store(old.sa_sigaction, Ordering::Relaxed);
            PREV_FLAGS.store(old.sa_flags as usize, Ordering::Relaxed);
        }
    });
}

/// The `SIGBUS` handler (see the module).
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for a handler installed
    // with SA_SIGINFO; `si_addr` is the faulting address for SIGBUS.
    let addr = unsafe { (*info).si_addr() } as usize;
    let in_scope = DEPTH.try_with(|d| d.get() > 0).unwrap_or(false);
    if in_scope && addr != 0 && replace_page(addr) {
        let _ = FAULTED.try_with(|c| {
            if c.get() == 0 {
                c.set(addr);
            }
        });
        return;
    }
    pass_on(sig, info, ctx);
}

/// Maps a private zero page over the page holding `addr`; whether it could.
fn replace_page(addr: usize) -> bool {
    for size in PAGE_SIZES {
        let page = addr & !(size - 1);
        // SAFETY: replaces the page the faulting access was to: a page of
        // a frontend's shared mapping (see the module), which nothing
        // but guest-memory accesses uses and which stays mapped (now
        // private and zero) until its region is unmapped as a whole.
        let p = unsafe {
            libc::mmap(
                page as *mut libc::c_void,
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            return true;
        }
    }
    false
}

/// Hands a fault outside [`catch`] to the action found at installation,
/// or restores the default action so the faulting access ends the process
/// when it runs again on return.
fn pass_on(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let prev = PREV_HANDLER.load(Ordering::Relaxed);
    let flags = PREV_FLAGS.load(Ordering::Relaxed) as libc::c_int;
    if prev == libc::SIG_DFL || prev == libc::SIG_IGN {
        // SAFETY: a zeroed sigaction with SIG_DFL is the default action.
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
        }
        return;
    }
    if flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous action was installed with SA_SIGINFO, so it
        // is a three-argument handler.
        let h: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(prev) };
        h(sig, info, ctx);
    } else {
        // SAFETY: a handler installed without SA_SIGINFO takes the signal.
        let h: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(prev) };
        h(sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    /// A memfd of `len` bytes mapped shared, as a frontend's region is.
    fn shared_memfd(len: usize) -> (OwnedFd, *mut u8) {
        // SAFETY: plain system calls on a new memfd; the mapping is ours.
        unsafe {
            let fd = libc::memfd_create(c"fault-test".as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0);
            let fd = OwnedFd::from_raw_fd(fd);
            assert_eq!(libc::ftruncate(fd.as_raw_fd(), len as libc::off_t), 0);
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            (fd, p.cast())
        }
    }

    /// A read and a write of a page the file no longer backs complete
    /// inside `catch` (the read sees zeros), report the first faulting
    /// address, and leave the pages still backed as they were.
    #[test]
    fn a_shrunk_file_faults_are_caught_and_reported() {
        let len = 4 * 4096;
        let (fd, p) = shared_memfd(len);
        // SAFETY: inside the mapping.
        unsafe { std::ptr::write_volatile(p, 7u8) };
        // SAFETY: shrinks our own memfd to one page.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), 4096) }, 0);
        let at = p as usize + 2 * 4096 + 10;
        // SAFETY: inside the mapping; the fault is recovered by `catch`.
        let (v, fault) = catch(|| unsafe { std::ptr::read_volatile(at as *const u8) });
        assert_eq!(v, 0);
        assert_eq!(fault, Some(Fault { addr: at }));
        let at2 = p as usize + 3 * 4096;
        // SAFETY: as above, a write.
        let ((), fault) = catch(|| unsafe { std::ptr::write_volatile(at2 as *mut u8, 1) });
        assert_eq!(fault, Some(Fault { addr: at2 }));
        // The page still backed is untouched and faults nothing.
        // SAFETY: inside the mapping's first page.
        let (v, fault) = catch(|| unsafe { std::ptr::read_volatile(p) });
        assert_eq!((v, fault), (7, None));
        assert!(!in_scope());
        // SAFETY: our mapping.
        unsafe { libc::munmap(p.cast(), len) };
    }

    /// Outside a scope a `SIGBUS` still ends the process (the handler
    /// passes it on): run in a child of the test binary.
    #[test]
    fn a_fault_outside_a_scope_still_ends_the_process() {
        if std::env::var_os("VRNIC_FAULT_CHILD").is_some() {
            let (fd, p) = shared_memfd(4096);
            let ((), _) = catch(|| ());
            // SAFETY: shrinks our own memfd, then touches the page: the
            // process is meant to die here.
            unsafe {
                libc::ftruncate(fd.as_raw_fd(), 0);
                std::ptr::write_volatile(p, 1);
            }
            std::process::exit(0);
        }
        use std::os::unix::process::ExitStatusExt;
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "fault::tests::a_fault_outside_a_scope_still_ends_the_process",
                "--nocapture",
            ])
            .env("VRNIC_FAULT_CHILD", "1")
            .output()
            .unwrap();
        assert_eq!(out.status.signal(), Some(libc::SIGBUS), "{out:?}");
    }

    /// An inner scope reports its own fault; the outer one sees only its
    /// own.
    #[test]
    fn scopes_nest() {
        let len = 2 * 4096;
        let (fd, p) = shared_memfd(len);
        // SAFETY: shrinks our own memfd to nothing.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), 0) }, 0);
        let (inner, outer) = catch(|| {
            // SAFETY: inside the mapping; recovered by the inner scope.
            let ((), f) = catch(|| unsafe { std::ptr::write_volatile(p, 1) });
            assert!(in_scope());
            f
        });
        assert_eq!(inner, Some(Fault { addr: p as usize }));
        assert_eq!(outer, None);
        // SAFETY: our mapping.
        unsafe { libc::munmap(p.cast(), len) };
    }
}
