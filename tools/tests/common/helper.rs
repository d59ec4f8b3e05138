//! A test run again as a helper process whose kernel refuses chosen system calls.
//!
//! A seccomp filter cannot be removed once installed, and it binds the thread that installs it
//! and every process that thread starts afterwards. So a test that needs the kernel to refuse a
//! call — as an older kernel or a locked-down container does — runs itself again:
//! [`run_helper`] starts this test binary with that test alone and a case name in
//! [`HELPER_ENV`]; there [`helper_case`] returns the case, the test installs its refusals with
//! [`refuse`], does its checks (a failed assert fails the helper, and so the test) and ends with
//! [`done`]. The variable is read by these tests only, never by the library.

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    TargetArch,
};

/// Names the case of a helper process (see the module documentation).
pub const HELPER_ENV: &str = "SWITCHYARD_TEST_HELPER";

/// The case this process was started for, when it is a helper.
pub fn helper_case() -> Option<String> {
    std::env::var(HELPER_ENV).ok()
}

/// Runs the test named `test` of this test binary alone, in a child process whose
/// [`helper_case`] is `case`, and returns its standard output. Panics (failing the calling
/// test) unless the child succeeded and reached the end of the case ([`done`]): a helper that
/// ran no test, or skipped its checks, does not pass.
pub fn run_helper(test: &str, case: &str) -> String {
    let exe = std::env::current_exe().expect("test binary");
    let out = std::process::Command::new(exe)
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env(HELPER_ENV, case)
        .output()
        .expect("the helper starts");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && stdout.contains(&done_line(case)),
        "helper {test} ({case}) failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Says that the helper got through `case` (what [`run_helper`] waits for).
pub fn done(case: &str) {
    print!("{}", done_line(case));
}

fn done_line(case: &str) -> String {
    format!("helper done: {case}\n")
}

/// A system call the kernel is to answer with `errno`: every call, or only those whose
/// arguments meet all of `only`.
#[derive(Debug)]
pub struct Refusal {
    /// The system call's number (`libc::SYS_*`).
    pub call: i64,
    /// Conditions on its arguments, all of which must hold (none: every call).
    pub only: Vec<SeccompCondition>,
    /// The error the call returns.
    pub errno: i32,
}

impl Refusal {
    /// Every call of `call` fails with `errno`.
    pub fn every(call: i64, errno: i32) -> Self {
        Self { call, only: Vec::new(), errno }
    }

    /// The calls of `call` whose argument `index` (`width` wide) compares with `value` as `op`
    /// says (`MaskedEq(mask)`: `argument & mask == value`) fail with `errno`.
    pub fn when(call: i64, index: u8, width: SeccompCmpArgLen, op: SeccompCmpOp, value: u64, errno: i32) -> Self {
        let condition = SeccompCondition::new(index, width, op, value).expect("a valid condition");
        Self { call, only: vec![condition], errno }
    }
}

/// Installs a seccomp filter per refusal on the calling thread (and so on every process it
/// starts from now on). Irreversible: only in a helper process.
pub fn refuse(refusals: Vec<Refusal>) {
    let arch = TargetArch::try_from(std::env::consts::ARCH).expect("an architecture seccompiler knows");
    for refusal in refusals {
        let rules = if refusal.only.is_empty() { Vec::new() } else { vec![SeccompRule::new(refusal.only).expect("a rule")] };
        let filter = SeccompFilter::new(
            [(refusal.call, rules)].into_iter().collect(),
            SeccompAction::Allow,
            SeccompAction::Errno(refusal.errno as u32),
            arch,
        )
        .expect("a filter");
        let program: BpfProgram = filter.try_into().expect("the filter compiles");
        seccompiler::apply_filter(&program).expect("the filter installs");
    }
}
