//! One persistent worker pool for the CPU backend: `threads - 1` workers plus the calling thread
//! split each op's tasks, with no thread spawned or task boxed per op.
//!
//! Design: a broadcast pool (as llama.cpp's ggml threadpool). [`Pool::run`] publishes a job (a
//! borrowed `Fn(task)` and a task count) under a new epoch number; workers, which spin briefly
//! on the epoch before parking on a condition variable, pick tasks from a shared atomic counter
//! alongside the caller. The caller returns once every task has finished and no worker still holds
//! the job: a worker that wakes late (descheduled on a busy machine) finds the job withdrawn and
//! does not hold the op up, since completion counts tasks, not workers. At decode size
//! an op is tens of microseconds, so waking parked threads per op (rayon's `install` +
//! `par_iter`) costs a sizeable share of a token; spinning between the ops of a step keeps the
//! hand-off to a cache line. Workers park after `SPIN_ROUNDS` idle polls, so an idle server
//! uses no CPU; a run makes the wake-up system call only when a worker is parked. Runs from two
//! threads at once are serialized; a run from inside a task runs inline on that thread.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Idle polls of the epoch before a worker parks (a fraction of a millisecond).
const SPIN_ROUNDS: u32 = 10_000;

/// A job: `(*const dyn Fn(usize), tasks)`, valid while its epoch is being run.
type JobPtr = *const (dyn Fn(usize) + Sync);

/// State shared by the caller and the workers.
struct Shared {
    /// Bumped (Release) after `job` is written for each run; workers Acquire it.
    epoch: AtomicU64,
    /// The current job and its epoch; set by the caller holding `run_lock` before `epoch` moves,
    /// withdrawn (`None`) once its tasks are done. Workers join it under this lock.
    job: Mutex<Option<(SendPtr, usize, u64)>>,
    /// Next task index to hand out.
    next: AtomicUsize,
    /// Tasks of the current job that have finished.
    finished: AtomicUsize,
    /// Workers that joined the current job and have not left it.
    active: AtomicUsize,
    /// Set on drop: workers exit.
    stop: AtomicBool,
    /// Parked workers wait here for a new epoch.
    wake: Condvar,
    /// Workers parked (or about to park) on `wake`; changed and read under `park`, so a run
    /// wakes them (a system call) only when one is parked.
    parked: AtomicUsize,
    /// Guards parking against a missed wake-up.
    park: Mutex<()>,
}

/// The job pointer, sendable to workers.
#[derive(Clone, Copy)]
struct SendPtr(JobPtr);
// SAFETY: the pointee is `Sync` (`dyn Fn + Sync`) and outlives every use: `run` withdraws the job
// and waits until no worker holds it before its borrow ends.
unsafe impl Send for SendPtr {}

thread_local! {
    /// True on a thread currently running a task of some pool (nested runs go inline).
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
}

/// The pool; dropping it stops and joins the workers.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    run_lock: Mutex<()>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("threads", &self.threads())
            .finish()
    }
}

impl Pool {
    /// A pool of `threads` threads in all (the caller counts as one; 0 means one per available
    /// core). Returns the error of a worker that cannot be spawned.
    pub fn new(threads: usize) -> std::io::Result<Pool> {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            threads
        };
        let mut pool = Pool::single();
        for i in 1..threads {
            let shared = Arc::clone(&pool.shared);
            let handle = std::thread::Builder::new()
                .name(format!("sov-cpu-{i}"))
                .spawn(move || worker(&shared))?;
            pool.workers.push(handle);
        }
        Ok(pool)
    }

    /// A pool of the calling thread alone (spawns nothing, so it cannot fail).
    pub fn single() -> Pool {
        Pool {
            shared: Arc::new(Shared {
                epoch: AtomicU64::new(0),
                job: Mutex::new(None),
                next: AtomicUsize::new(0),
                finished: AtomicUsize::new(0),
                active: AtomicUsize::new(0),
                stop: AtomicBool::new(false),
                wake: Condvar::new(),
                parked: AtomicUsize::new(0),
                park: Mutex::new(()),
            }),
            workers: Vec::new(),
            run_lock: Mutex::new(()),
        }
    }

    /// Threads that run tasks, the caller included.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(0) .. f(tasks - 1)`, each once, spread over the pool's threads; returns when all
    /// have finished. A panic in a task aborts the process (tasks are kernels over checked
    /// shapes).
    pub fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if tasks == 0 {
            return;
        }
        if tasks == 1 || self.workers.is_empty() || IN_TASK.with(Cell::get) {
            (0..tasks).for_each(f);
            return;
        }
        let _serial = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        // SAFETY (of the lifetime erasure below): workers dereference the pointer only while
        // counted in `active`, and this function withdraws the job and waits for `active` to
        // reach zero before it returns.
        let ptr: JobPtr = unsafe {
            std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static (dyn Fn(usize) + Sync)>(f)
        };
        s.next.store(0, Ordering::Relaxed);
        s.finished.store(0, Ordering::Relaxed);
        let epoch = s.epoch.load(Ordering::Relaxed) + 1;
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = Some((SendPtr(ptr), tasks, epoch));
        let sleepers = {
            let _g = s.park.lock().unwrap_or_else(|e| e.into_inner());
            s.epoch.store(epoch, Ordering::Release);
            s.parked.load(Ordering::Relaxed)
        };
        if sleepers > 0 {
            s.wake.notify_all();
        }
        run_tasks(s, f, tasks);
        wait_until(|| s.finished.load(Ordering::Acquire) >= tasks);
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
        wait_until(|| s.active.load(Ordering::Acquire) == 0);
    }
}

/// Spins (then yields) until `done()`.
fn wait_until(done: impl Fn() -> bool) {
    let mut spins = 0u32;
    while !done() {
        spins += 1;
        if spins < SPIN_ROUNDS {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

impl Pool {
    /// Runs `f(i, row_i)` over the `len`-element rows of `out` (a trailing partial row included),
    /// `per_task` rows to a task.
    pub fn rows_mut<T: Send>(
        &self,
        out: &mut [T],
        len: usize,
        per_task: usize,
        f: &(dyn Fn(usize, &mut [T]) + Sync),
    ) {
        let (len, per_task) = (len.max(1), per_task.max(1));
        let rows = out.len().div_ceil(len);
        let p = SharedMut::new(out);
        self.run(rows.div_ceil(per_task), &|t| {
            for i in t * per_task..((t + 1) * per_task).min(rows) {
                // SAFETY: row `i` belongs to task `t` only, and `out` is borrowed for the run.
                f(i, unsafe { p.chunk(i * len, (i + 1) * len) });
            }
        });
    }
}

/// Takes tasks from the shared counter until none are left.
fn run_tasks(s: &Shared, f: &(dyn Fn(usize) + Sync), tasks: usize) {
    let was = IN_TASK.with(|t| t.replace(true));
    let guard = AbortOnPanic;
    loop {
        let i = s.next.fetch_add(1, Ordering::Relaxed);
        if i >= tasks {
            break;
        }
        f(i);
        s.finished.fetch_add(1, Ordering::Release);
    }
    std::mem::forget(guard);
    IN_TASK.with(|t| t.set(was));
}

/// Aborts if a task unwinds: the caller would otherwise wait forever, or return while a worker
/// still holds its borrowed job.
struct AbortOnPanic;

impl Drop for AbortOnPanic {
    fn drop(&mut self) {
        eprintln!("sov: a CPU kernel task panicked; aborting");
        std::process::abort();
    }
}

/// A worker: wait for a new epoch (spin, then park), run its tasks, check in.
fn worker(s: &Shared) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0u32;
        let epoch = loop {
            let e = s.epoch.load(Ordering::Acquire);
            if e != seen || s.stop.load(Ordering::Relaxed) {
                break e;
            }
            spins += 1;
            if spins < SPIN_ROUNDS {
                std::hint::spin_loop();
                continue;
            }
            let mut g = s.park.lock().unwrap_or_else(|e| e.into_inner());
            s.parked.fetch_add(1, Ordering::Relaxed);
            while s.epoch.load(Ordering::Acquire) == seen && !s.stop.load(Ordering::Relaxed) {
                g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            s.parked.fetch_sub(1, Ordering::Relaxed);
            drop(g);
            spins = 0;
        };
        if s.stop.load(Ordering::Relaxed) {
            return;
        }
        seen = epoch;
        let job = {
            let g = s.job.lock().unwrap_or_else(|e| e.into_inner());
            match *g {
                Some((ptr, tasks, e)) if e == epoch => {
                    s.active.fetch_add(1, Ordering::AcqRel);
                    Some((ptr, tasks))
                }
                _ => None, // withdrawn: the caller finished without this worker
            }
        };
        if let Some((SendPtr(ptr), tasks)) = job {
            // SAFETY: this worker is counted in `active`, so `run` has not returned and the job
            // it points to is alive until the decrement below.
            let f = unsafe { &*ptr };
            run_tasks(s, f, tasks);
            s.active.fetch_sub(1, Ordering::Release);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        {
            let _g = self.shared.park.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.stop.store(true, Ordering::Relaxed);
            self.shared.epoch.fetch_add(1, Ordering::Release);
        }
        self.shared.wake.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// A raw pointer to disjoint parts of one slice, shared by the tasks of a run.
#[derive(Clone, Copy)]
pub struct SharedMut<T>(*mut T, usize);
// SAFETY: tasks only touch disjoint ranges (the users' contract, see `chunk`), and the slice
// outlives the run.
unsafe impl<T: Send> Send for SharedMut<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    /// Wraps `s` for the duration of a run.
    pub fn new(s: &mut [T]) -> Self {
        SharedMut(s.as_mut_ptr(), s.len())
    }

    /// The sub-slice `start .. end` (clamped to the slice).
    ///
    /// # Safety
    /// No other live reference (from another task) overlaps `start .. end`, and the slice this
    /// was made from is still borrowed by the caller of the run.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn chunk(&self, start: usize, end: usize) -> &mut [T] {
        let end = end.min(self.1);
        let start = start.min(end);
        // SAFETY: `start <= end <= len` of the original slice; exclusivity is the caller's.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), end - start) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_task_runs_once_across_many_runs() {
        let pool = Pool::new(3).expect("pool");
        assert_eq!(pool.threads(), 3);
        for tasks in [0usize, 1, 2, 7, 64, 1000] {
            let hits: Vec<AtomicU32> = (0..tasks).map(|_| AtomicU32::new(0)).collect();
            for _ in 0..50 {
                pool.run(tasks, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
            }
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 50),
                "{tasks}"
            );
        }
    }

    #[test]
    fn nested_and_concurrent_runs_complete() {
        let pool = Arc::new(Pool::new(2).expect("pool"));
        let total = AtomicUsize::new(0);
        std::thread::scope(|sc| {
            for _ in 0..3 {
                sc.spawn(|| {
                    for _ in 0..100 {
                        pool.run(4, &|_| {
                            pool.run(3, &|_| {
                                total.fetch_add(1, Ordering::Relaxed);
                            });
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 3 * 100 * 4 * 3);
    }

    #[test]
    fn shared_mut_chunks_write_disjoint_parts() {
        let pool = Pool::new(2).expect("pool");
        let mut v = vec![0usize; 1003];
        let p = SharedMut::new(&mut v);
        pool.run(1003usize.div_ceil(100), &|t| {
            // SAFETY: task `t` owns elements `100 t .. 100 t + 100` only.
            let c = unsafe { p.chunk(t * 100, t * 100 + 100) };
            for (i, x) in c.iter_mut().enumerate() {
                *x = t * 100 + i;
            }
        });
        assert!(v.iter().enumerate().all(|(i, x)| i == *x));
    }
}
