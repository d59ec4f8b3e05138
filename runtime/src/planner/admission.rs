//! Admission and placement of agent sessions (paper 000): where and when a session's next model
//! turn runs, decided by one of five schedulers behind one interface — TAO (session value and
//! the exact dynamic program of [`super::tao`]) and the baselines the paper compares against:
//! round-robin and cache-aware routing (vLLM production stack), a Dynamo-like KV router, and
//! ThunderAgent's program scheduler.
//!
//! Two kinds of scheduler: *routers* (round-robin, cache-aware, Dynamo) send every request to
//! a replica the moment it is ready and let the engine queue it; *admission* schedulers
//! (ThunderAgent, TAO) keep sessions in a waiting pool and admit them onto replicas within a
//! token capacity. The shell (the simulator's agent loop) reports what it observes — sessions,
//! the tokens each replica's admitted sessions hold, cached-token observations, tool returns —
//! and applies what these functions decide.
//!
//! Pure: no I/O, no clock (`now` is an argument), no randomness. Must not depend on the shells,
//! the emulator or the tools crate.

use super::tao::{self, Candidate, Plan, Problem, TaoError, ToolCall, ToolHistory};

/// A cached-token observation of one session on one replica: after its request finished
/// there, the engine held `tokens` of its conversation (prompt and output blocks), as of `at`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheObservation {
    pub replica: usize,
    pub tokens: u64,
    pub at: f64,
}

/// A session as the scheduler sees it between two model turns.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolSession {
    pub session: u64,
    /// Changes whenever the session moves on (a turn dispatched or finished): a plan made for
    /// an older signature is stale (Appendix B.2).
    pub signature: u64,
    /// Prompt tokens of its next request (its whole conversation; while a tool still runs,
    /// the conversation so far plus the observation the trace will append — the token count
    /// a scheduler reads from the session).
    pub tokens: u64,
    /// The tool call it waits on; `None` for a new session.
    pub call: Option<ToolCall>,
    /// Its next request can be sent now (a new session, or its tool returned).
    pub returned: bool,
    /// Leading tokens it shares with every other session (the system prompt): held once per
    /// replica, not per session.
    pub shared_tokens: u64,
    /// The latest cached-token observation per replica it ran on.
    pub cache: Vec<CacheObservation>,
    /// When it entered the pool (its last request finished, or it arrived).
    pub since: f64,
}

/// One replica's load as the scheduler sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaLoad {
    /// KV tokens the replica holds (its engine's KV blocks × block size).
    pub kv_tokens: u64,
    /// Admission weight of the sessions admitted to it and not yet back in the pool.
    pub admitted_tokens: u64,
    /// Tokens of the prefix its sessions share (the system prompt), held once.
    pub shared_tokens: u64,
    /// Requests running or queued in its engine.
    pub requests: u32,
    /// KV blocks referenced by its running requests (the decode load a KV router counts).
    pub active_blocks: u64,
}

/// The schedulers this module offers (names as `bench tao` reports them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SchedulerKind {
    RoundRobin,
    CacheAware,
    Dynamo,
    ThunderAgent,
    Tao,
}

impl SchedulerKind {
    pub const ALL: [SchedulerKind; 5] = [
        SchedulerKind::Dynamo,
        SchedulerKind::RoundRobin,
        SchedulerKind::CacheAware,
        SchedulerKind::ThunderAgent,
        SchedulerKind::Tao,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SchedulerKind::RoundRobin => "vllm-rr",
            SchedulerKind::CacheAware => "vllm-ca",
            SchedulerKind::Dynamo => "dynamo",
            SchedulerKind::ThunderAgent => "thunderagent",
            SchedulerKind::Tao => "tao",
        }
    }

    /// Whether it admits from a waiting pool (else it routes each request when ready).
    pub fn admits(self) -> bool {
        matches!(self, SchedulerKind::ThunderAgent | SchedulerKind::Tao)
    }
}

/// The prefix-cache evidence a router has for a request on each replica: tokens of the prompt
/// it believes the replica holds.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteRequest {
    pub session: u64,
    pub prompt_tokens: u64,
    /// Per replica, the prompt tokens the router's index says are cached there.
    pub overlap_tokens: Vec<u64>,
}

/// vLLM production stack's round-robin router: requests go to the replicas in turn.
#[derive(Debug, Default, Clone)]
pub struct RoundRobin {
    next: usize,
}

impl RoundRobin {
    pub fn route(&mut self, replicas: &[ReplicaLoad]) -> usize {
        let n = replicas.len().max(1);
        let pick = self.next % n;
        self.next = (self.next + 1) % n;
        pick
    }
}

/// Cache-aware (prefix-locality) routing as SGLang's router and vLLM production stack's
/// prefix-aware router do it: when the replicas' loads are balanced, the replica whose cache
/// matches the longest prefix, if the match covers at least `CACHE_THRESHOLD` of the prompt;
/// otherwise (or when the loads are imbalanced) the least-loaded replica.
#[derive(Debug, Default, Clone)]
pub struct CacheAware;

/// SGLang router defaults (`cache_threshold`, `balance_abs_threshold`, `balance_rel_threshold`).
pub const CACHE_THRESHOLD: f64 = 0.5;
pub const BALANCE_ABS_THRESHOLD: u32 = 32;
pub const BALANCE_REL_THRESHOLD: f64 = 1.0001;

impl CacheAware {
    pub fn route(&self, req: &RouteRequest, replicas: &[ReplicaLoad]) -> usize {
        let least_loaded = least_by(replicas.len(), |b| (replicas[b].requests as u64, b as u64));
        let (min, max) = replicas.iter().fold((u32::MAX, 0), |(lo, hi), r| (lo.min(r.requests), hi.max(r.requests)));
        let imbalanced =
            max.saturating_sub(min) > BALANCE_ABS_THRESHOLD && f64::from(max) > BALANCE_REL_THRESHOLD * f64::from(min);
        if imbalanced {
            return least_loaded;
        }
        // Longest match; ties to the less-loaded, then the lower index.
        let best = least_by(replicas.len(), |b| {
            (u64::MAX - req.overlap_tokens.get(b).copied().unwrap_or(0), replicas[b].requests as u64)
        });
        let matched = req.overlap_tokens.get(best).copied().unwrap_or(0) as f64;
        if req.prompt_tokens > 0 && matched / req.prompt_tokens as f64 >= CACHE_THRESHOLD { best } else { least_loaded }
    }
}

/// A Dynamo-like KV router (ai-dynamo/dynamo's KV-aware routing): the cost of a replica is
/// `overlap_weight × (prompt blocks it would have to prefill) + (KV blocks active on it)`, and
/// the request goes to the cheapest (temperature 0: no sampling).
#[derive(Debug, Clone)]
pub struct DynamoRouter {
    pub overlap_weight: f64,
    pub block_size: u64,
}

impl Default for DynamoRouter {
    fn default() -> Self {
        DynamoRouter { overlap_weight: 1.0, block_size: 16 }
    }
}

impl DynamoRouter {
    pub fn route(&self, req: &RouteRequest, replicas: &[ReplicaLoad]) -> usize {
        let blocks = req.prompt_tokens.div_ceil(self.block_size);
        let cost = |b: usize| {
            let cached = req.overlap_tokens.get(b).copied().unwrap_or(0) / self.block_size;
            let prefill = blocks.saturating_sub(cached) as f64;
            self.overlap_weight * prefill + replicas[b].active_blocks as f64
        };
        let mut best = 0;
        for b in 1..replicas.len() {
            if cost(b) < cost(best) {
                best = b;
            }
        }
        best
    }
}

/// The first index minimising `key`.
fn least_by(n: usize, key: impl Fn(usize) -> (u64, u64)) -> usize {
    (0..n).min_by_key(|&b| (key(b), b)).unwrap_or(0)
}

/// TAO's options: the paper's configuration and its ablations (Table 4).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct TaoOptions {
    /// Decayed KV-cache credit in the value (off: "w/o cache value").
    pub cache_credit: bool,
    /// Tool-return readiness in the value (off: "w/o readiness").
    pub readiness: bool,
    /// The value is the token footprint alone, ThunderAgent's pause ordering ("w/o session
    /// evaluation").
    pub token_order_only: bool,
    /// Best-fit-decreasing instead of the dynamic program ("w/o decision making").
    pub bfd: bool,
    /// Capacity quantum Δ, tokens.
    pub quantum: u64,
    /// Live DP states before the solve falls back to BFD.
    pub state_budget: usize,
    /// Share of a replica's KV tokens admission may fill (the safe limit; the paper's C_b is
    /// the remaining capacity the metrics report, so 1).
    pub safe_fraction: f64,
    /// Tokens reserved per admitted session for its output (paper 000 Appendix G: 512).
    pub reserve_tokens: u64,
}

impl Default for TaoOptions {
    fn default() -> Self {
        TaoOptions {
            cache_credit: true,
            readiness: true,
            token_order_only: false,
            bfd: false,
            quantum: 2_048,
            state_budget: 200_000,
            safe_fraction: 1.0,
            reserve_tokens: 512,
        }
    }
}

/// The admission cost w_i of a session (paper 000 Appendix B.1): the memory demand of its
/// total token count minus the tokens it shares with other sessions, plus the output reserve.
pub fn admission_weight(s: &PoolSession, reserve: u64) -> u64 {
    s.tokens.saturating_sub(s.shared_tokens) + reserve
}

/// Residual admission capacity C_b of each replica: the safe share of its KV tokens minus the
/// shared prefix and what its admitted sessions hold.
pub fn residual_capacities(replicas: &[ReplicaLoad], safe_fraction: f64) -> Vec<u64> {
    replicas
        .iter()
        .map(|r| {
            ((r.kv_tokens as f64 * safe_fraction).floor() as u64).saturating_sub(r.shared_tokens + r.admitted_tokens)
        })
        .collect()
}

/// TAO's session evaluation (Eq. 2–6) of every pooled session on every replica, as the
/// candidates of the dynamic program.
pub fn tao_candidates(
    pool: &[PoolSession],
    replicas: &[ReplicaLoad],
    history: &ToolHistory,
    now: f64,
    opts: &TaoOptions,
) -> Vec<Candidate> {
    pool.iter()
        .map(|s| {
            let ready = if opts.token_order_only {
                false
            } else if s.returned {
                true
            } else if opts.readiness {
                s.call.as_ref().is_some_and(|c| tao::readiness(c, history, now))
            } else {
                false
            };
            let options = (0..replicas.len())
                .map(|b| {
                    let credit = if opts.cache_credit && !opts.token_order_only {
                        s.cache
                            .iter()
                            .find(|o| o.replica == b)
                            .map(|o| tao::decayed_credit(o.tokens, o.at, now, tao::HALF_LIFE_S))
                            .unwrap_or(0)
                    } else {
                        0
                    };
                    (b, credit)
                })
                .collect();
            Candidate {
                session: s.session,
                signature: s.signature,
                weight: admission_weight(s, opts.reserve_tokens),
                ready,
                tokens: s.tokens,
                options,
            }
        })
        .collect()
}

/// One TAO planning step on a frozen snapshot: evaluate, then solve (DP, or BFD in the
/// ablation / when the state budget is exceeded).
pub fn tao_plan(
    pool: &[PoolSession],
    replicas: &[ReplicaLoad],
    history: &ToolHistory,
    now: f64,
    opts: &TaoOptions,
) -> Result<Plan, TaoError> {
    let problem = Problem {
        candidates: tao_candidates(pool, replicas, history, now, opts),
        capacities: residual_capacities(replicas, opts.safe_fraction),
        quantum: opts.quantum,
        state_budget: opts.state_budget,
    };
    let plan = if opts.bfd { tao::best_fit_decreasing(&problem)? } else { tao::solve(&problem)? };
    Ok(balance_ties(&problem, plan))
}

/// Among plans of equal objective, the balanced one: a selected session whose value is the same
/// on several replicas (no cache credit on any, typically a new session) goes to the one of
/// those with the most residual quantized capacity, heaviest first — the least-loaded rule
/// every baseline applies to sessions without cache evidence. The selection and every value
/// stay the DP's (so the objective is unchanged); if the re-placement cannot fit them all, the
/// plan is returned as solved.
pub fn balance_ties(problem: &Problem, mut plan: Plan) -> Plan {
    let q = problem.quantum.max(1);
    let mut residual: Vec<u64> = problem.capacities.iter().map(|c| c / q).collect();
    let mut movable: Vec<(usize, Vec<usize>)> = Vec::new();
    for (k, a) in plan.assignments.iter().enumerate() {
        let Some(c) = problem.candidates.iter().find(|c| c.session == a.session) else { return plan };
        let credit = c.options.iter().find(|o| o.0 == a.replica).map(|o| o.1);
        let tied: Vec<usize> = c.options.iter().filter(|o| Some(o.1) == credit).map(|o| o.0).collect();
        if tied.len() > 1 {
            movable.push((k, tied));
        } else {
            let Some(r) = residual.get_mut(a.replica) else { return plan };
            *r = r.saturating_sub(a.weight.div_ceil(q));
        }
    }
    movable.sort_by_key(|(k, _)| (std::cmp::Reverse(plan.assignments[*k].weight), plan.assignments[*k].session));
    let mut placed = Vec::with_capacity(movable.len());
    for (k, tied) in &movable {
        let w = plan.assignments[*k].weight.div_ceil(q);
        let best = tied
            .iter()
            .copied()
            .filter(|&b| residual.get(b).is_some_and(|&r| r >= w))
            .max_by_key(|&b| (residual[b], std::cmp::Reverse(b)));
        let Some(b) = best else { return plan };
        residual[b] -= w;
        placed.push((*k, b));
    }
    for (k, b) in placed {
        plan.assignments[k].replica = b;
    }
    plan
}

/// ThunderAgent's per-program bookkeeping buffer (`BUFFER_PER_PROGRAM`, tokens).
pub const THUNDER_BUFFER: u64 = 100;
/// ThunderAgent's scheduler period (`scheduler_interval`, seconds).
pub const THUNDER_PERIOD_S: f64 = 5.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProgramStatus {
    /// A request in flight, or pending while paused.
    Reasoning,
    /// Off the GPU: its tool runs.
    Acting,
}

#[derive(Debug, Clone, PartialEq)]
struct Program {
    status: ProgramStatus,
    /// `Some(backend)` while active; `None` while paused.
    backend: Option<usize>,
    /// The whole context (`usage.total_tokens` of its last response).
    tokens: u64,
    /// Marked to pause at its next tool boundary.
    marked: bool,
    /// Model calls made (1 = new program).
    steps: u32,
    /// Order it was paused in (FIFO tie-break of the global queue).
    paused_seq: u64,
    /// Its tokens when it was paused: the global queue's sort key (the proxy's
    /// `PausedInfo.total_tokens`).
    paused_tokens: u64,
    /// When its last response finished (it entered ACTING), seconds.
    acting_since: f64,
}

/// ThunderAgent's program scheduler (ThunderAgent-org/ThunderAgent `scheduler/router.py`, read
/// for its rules; written here): programs are sticky to a backend while active; each backend's
/// working set is the tokens of its active programs (reasoning and acting alike) plus a
/// 100-token buffer each, against its KV token capacity. Every 5 s it first resumes paused
/// programs — pending requests first, then programs still on their first request, then idle
/// ones, each smallest first by its tokens when it was paused, while their total fits the free
/// capacity, placed largest first on the backend with the
/// most room (its "best-fit-decreasing") — then, on each backend over capacity, pauses acting
/// programs smallest first and, when none is left, marks its reasoning programs to pause at
/// their next tool boundary. A new program goes to the backend with the fewest active tokens
/// that has room, unless programs already wait in the global queue.
///
/// With [`ThunderAgent::with_acting_decay`] (the proxy's `--use-acting-token-decay`, which
/// paper 002 ran: "priority decay on, the configuration of its paper") the resume step counts
/// an acting program's tokens at 2^−t of their number, t the seconds since its last response
/// finished (`remaining_capacity_with_decay`: optimistic, the tool is expected to have let its
/// KV go cold), while the pause step counts them whole. Off by default, as the proxy ships.
/// A program's tokens are the prompt of its latest request while the request runs (the proxy
/// re-estimates them from the request's payload) and its `usage.total_tokens` once it ends;
/// the proxy's streaming increments in between are not modelled. The proxy's `shared_tokens`
/// credit is left out because the released proxy never updates it (its `update_shared_tokens`
/// has no caller in `ThunderAgent-org/ThunderAgent`), so it stays 0.
#[derive(Debug, Clone, Default)]
pub struct ThunderAgent {
    programs: std::collections::BTreeMap<u64, Program>,
    paused_seq: u64,
    acting_decay: bool,
}

impl ThunderAgent {
    pub fn new() -> Self {
        Self::default()
    }

    /// The proxy with (true) or without its 2^−t decay of acting programs' tokens at resume.
    pub fn with_acting_decay(mut self, on: bool) -> Self {
        self.acting_decay = on;
        self
    }

    /// Remaining capacity as the resume step sees it: with decay, each acting program's tokens
    /// weigh 2^−t (t seconds since it entered ACTING; the proxy truncates the sum to tokens).
    fn remaining_for_resume(&self, backend: usize, kv_tokens: u64, now: f64) -> i64 {
        if !self.acting_decay {
            return self.remaining(backend, kv_tokens);
        }
        let mut reasoning = 0u64;
        let mut acting = 0.0f64;
        let mut count = 0u64;
        for p in self.on_backend(backend) {
            count += 1;
            match p.status {
                ProgramStatus::Reasoning => reasoning += p.tokens,
                ProgramStatus::Acting => acting += p.tokens as f64 * (-(now - p.acting_since).max(0.0)).exp2(),
            }
        }
        let effective = (reasoning as f64 + acting) as i64;
        kv_tokens as i64 - effective - (count * THUNDER_BUFFER) as i64
    }

    /// The programs active on `backend`.
    fn on_backend(&self, backend: usize) -> impl Iterator<Item = &Program> {
        self.programs.values().filter(move |p| p.backend == Some(backend))
    }

    /// The tokens of the programs active on `backend` (the proxy's `active_program_tokens`).
    fn active_tokens(&self, backend: usize) -> u64 {
        self.on_backend(backend).map(|p| p.tokens).sum()
    }

    /// Their tokens plus a buffer each: what the capacity checks count.
    fn used(&self, backend: usize) -> u64 {
        self.on_backend(backend).map(|p| p.tokens + THUNDER_BUFFER).sum()
    }

    fn remaining(&self, backend: usize, kv_tokens: u64) -> i64 {
        kv_tokens as i64 - self.used(backend) as i64
    }

    fn waiting(&self) -> bool {
        self.programs.values().any(|p| p.backend.is_none())
    }

    /// A new program with its first request (`tokens` long): its backend, or `None` when it
    /// queues.
    pub fn arrive(&mut self, id: u64, tokens: u64, replicas: &[ReplicaLoad]) -> Option<usize> {
        let queue_busy = self.waiting();
        let pick = if queue_busy {
            None
        } else {
            (0..replicas.len())
                .filter(|&b| self.remaining(b, replicas[b].kv_tokens) >= (tokens + THUNDER_BUFFER) as i64)
                .min_by_key(|&b| (self.active_tokens(b), b))
        };
        self.paused_seq += 1;
        self.programs.insert(
            id,
            Program {
                status: ProgramStatus::Reasoning,
                backend: pick,
                tokens,
                marked: false,
                steps: 1,
                paused_seq: self.paused_seq,
                paused_tokens: tokens,
                acting_since: 0.0,
            },
        );
        pick
    }

    /// The program's next request, `tokens` long, is ready (its tool returned): its backend if
    /// active, `None` while paused (the request waits for a resume). Its tokens are now the
    /// request's (the proxy's estimate from the payload): a thinking model's reasoning, dropped
    /// from the conversation, no longer counts.
    pub fn request(&mut self, id: u64, tokens: u64) -> Option<usize> {
        let p = self.programs.get_mut(&id)?;
        p.status = ProgramStatus::Reasoning;
        p.steps += 1;
        p.tokens = tokens;
        p.backend
    }

    /// Its response finished at `now` with `total_tokens` of context: it acts (runs a tool); a
    /// program marked for pause is paused now.
    pub fn response_done(&mut self, id: u64, total_tokens: u64, now: f64) {
        self.paused_seq += 1;
        let seq = self.paused_seq;
        if let Some(p) = self.programs.get_mut(&id) {
            p.status = ProgramStatus::Acting;
            p.acting_since = now;
            p.tokens = total_tokens;
            if p.marked {
                p.marked = false;
                p.backend = None;
                p.paused_seq = seq;
                p.paused_tokens = total_tokens;
            }
        }
    }

    /// The program ended.
    pub fn release(&mut self, id: u64) {
        self.programs.remove(&id);
    }

    /// One scheduler period at `now`: resumes (returning `(program, backend)` for each), then
    /// pauses.
    pub fn tick(&mut self, replicas: &[ReplicaLoad], now: f64) -> Vec<(u64, usize)> {
        let resumed = self.resume(replicas, now);
        for (b, r) in replicas.iter().enumerate() {
            self.pause_until_safe(b, r.kv_tokens);
        }
        resumed
    }

    fn resume(&mut self, replicas: &[ReplicaLoad], now: f64) -> Vec<(u64, usize)> {
        let mut caps: Vec<(usize, i64)> = (0..replicas.len())
            .map(|b| (b, self.remaining_for_resume(b, replicas[b].kv_tokens, now)))
            .filter(|&(_, c)| c > THUNDER_BUFFER as i64)
            .collect();
        let total: i64 = caps.iter().map(|&(_, c)| c).sum();
        let mut paused: Vec<(u8, u64, u64, u64, u64)> = self
            .programs
            .iter()
            .filter(|(_, p)| p.backend.is_none())
            .map(|(&id, p)| {
                // The proxy's groups: a program still on its first request, then one with a
                // request pending, then one acting.
                let group = match (p.steps, p.status) {
                    (1, _) => 1,
                    (_, ProgramStatus::Reasoning) => 0,
                    (_, ProgramStatus::Acting) => 2,
                };
                (group, p.paused_tokens, p.paused_seq, id, p.tokens)
            })
            .collect();
        paused.sort();
        let mut selected = Vec::new();
        let mut cumulative = 0i64;
        for &(_, _, _, id, tokens) in &paused {
            let need = (tokens + THUNDER_BUFFER) as i64;
            if cumulative + need <= total {
                cumulative += need;
                selected.push((tokens, id));
            }
        }
        // Largest first, each onto the backend with the most room.
        selected.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut out = Vec::new();
        for (tokens, id) in selected {
            caps.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            let need = (tokens + THUNDER_BUFFER) as i64;
            let Some(slot) = caps.first_mut().filter(|(_, c)| *c >= need) else { continue };
            slot.1 -= need;
            let b = slot.0;
            caps.retain(|&(_, c)| c > THUNDER_BUFFER as i64);
            if let Some(p) = self.programs.get_mut(&id) {
                p.backend = Some(b);
                out.push((id, b));
            }
        }
        out
    }

    fn pause_until_safe(&mut self, b: usize, kv_tokens: u64) {
        while self.remaining(b, kv_tokens) < 0 {
            let acting = self
                .programs
                .iter()
                .filter(|(_, p)| p.backend == Some(b) && p.status == ProgramStatus::Acting)
                .min_by_key(|(id, p)| (p.tokens, **id))
                .map(|(&id, _)| id);
            if let Some(id) = acting {
                self.paused_seq += 1;
                let seq = self.paused_seq;
                if let Some(p) = self.programs.get_mut(&id) {
                    p.backend = None;
                    p.paused_seq = seq;
                    p.paused_tokens = p.tokens;
                }
                continue;
            }
            // No acting program left: mark the reasoning ones to pause at their next tool
            // boundary. Marking frees nothing now, so (as in the original) every unmarked
            // reasoning program of the backend is marked.
            for p in self.programs.values_mut().filter(|p| p.backend == Some(b) && p.status == ProgramStatus::Reasoning)
            {
                p.marked = true;
            }
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(kv: u64, requests: u32, active: u64) -> ReplicaLoad {
        ReplicaLoad { kv_tokens: kv, admitted_tokens: 0, shared_tokens: 0, requests, active_blocks: active }
    }

    #[test]
    fn round_robin_cycles() {
        let mut rr = RoundRobin::default();
        let l = vec![load(1, 0, 0); 3];
        assert_eq!((0..5).map(|_| rr.route(&l)).collect::<Vec<_>>(), [0, 1, 2, 0, 1]);
    }

    #[test]
    fn cache_aware_follows_the_prefix_unless_loads_are_imbalanced() {
        let req = RouteRequest { session: 1, prompt_tokens: 1000, overlap_tokens: vec![0, 900, 100] };
        assert_eq!(CacheAware.route(&req, &[load(1, 5, 0), load(1, 6, 0), load(1, 4, 0)]), 1);
        // Below the match threshold: the least loaded.
        let weak = RouteRequest { overlap_tokens: vec![0, 200, 100], ..req.clone() };
        assert_eq!(CacheAware.route(&weak, &[load(1, 5, 0), load(1, 6, 0), load(1, 4, 0)]), 2);
        // Imbalanced (gap > 32 and max > 1.0001 × min): the least loaded.
        assert_eq!(CacheAware.route(&req, &[load(1, 5, 0), load(1, 60, 0), load(1, 4, 0)]), 2);
    }

    #[test]
    fn dynamo_cost_is_prefill_blocks_plus_active_blocks() {
        // Dynamo's documentation example: (prefill, decode) = (8, 10), (5, 5), (2, 9) → costs
        // 18, 10, 11: the second worker.
        let d = DynamoRouter { overlap_weight: 1.0, block_size: 16 };
        let req = RouteRequest { session: 0, prompt_tokens: 8 * 16, overlap_tokens: vec![0, 3 * 16, 6 * 16] };
        assert_eq!(d.route(&req, &[load(1, 0, 10), load(1, 0, 5), load(1, 0, 9)]), 1);
    }

    #[test]
    fn thunderagent_pauses_acting_programs_smallest_first_and_resumes_pending_ones_first() {
        let l = vec![load(10_000, 0, 0)];
        let mut t = ThunderAgent::new();
        assert_eq!(t.arrive(1, 3_000, &l), Some(0));
        assert_eq!(t.arrive(2, 2_000, &l), Some(0));
        assert_eq!(t.arrive(3, 4_000, &l), Some(0));
        // 9,300 used of 10,000: a fourth does not fit and queues.
        assert_eq!(t.arrive(4, 1_000, &l), None);
        // Responses grow the contexts past capacity; all act.
        t.response_done(1, 3_500, 1.0);
        t.response_done(2, 2_600, 1.0);
        t.response_done(3, 4_200, 1.0);
        let resumed = t.tick(&l, 5.0);
        assert!(resumed.is_empty());
        // Over by 10,600 − 10,000: the smallest acting program (2) is paused.
        assert_eq!(t.programs[&2].backend, None);
        assert_eq!(t.programs[&1].backend, Some(0));
        // Program 1 ends: the next tick resumes the paused ones that fit, the new program 4
        // (pending request) before program 2 (acting).
        t.release(1);
        let resumed = t.tick(&l, 10.0);
        assert_eq!(resumed.iter().map(|r| r.0).collect::<Vec<_>>(), [2, 4]);
        assert_eq!(t.request(4, 1_000), Some(0));
    }

    #[test]
    fn a_program_paused_on_its_first_request_resumes_before_idle_ones_whatever_its_status() {
        let paused = |steps: u32, status: ProgramStatus, tokens: u64, seq: u64| Program {
            status,
            backend: None,
            tokens,
            marked: false,
            steps,
            paused_seq: seq,
            paused_tokens: tokens,
            acting_since: 0.0,
        };
        let mut t = ThunderAgent::new();
        // 1: still on its first call, acting when paused; 2: idle (acting) after three calls;
        // 3: a request pending.
        t.programs.insert(1, paused(1, ProgramStatus::Acting, 3_000, 1));
        t.programs.insert(2, paused(3, ProgramStatus::Acting, 2_000, 2));
        t.programs.insert(3, paused(2, ProgramStatus::Reasoning, 4_000, 3));
        // 8,000 free: the pending request (4,100), then the first-call program (3,100); the
        // idle one (2,100) no longer fits the total although it is the smallest.
        let mut resumed: Vec<u64> = t.tick(&[load(8_000, 0, 0)], 5.0).into_iter().map(|r| r.0).collect();
        resumed.sort();
        assert_eq!(resumed, [1, 3]);
    }

    #[test]
    fn a_request_counts_its_own_prompt_not_the_reasoning_its_predecessor_dropped() {
        let l = vec![load(10_000, 0, 0)];
        let mut t = ThunderAgent::new();
        assert_eq!(t.arrive(1, 2_000, &l), Some(0));
        // Prompt 2,000 + 3,000 of reasoning and answer; the next prompt drops the reasoning.
        t.response_done(1, 5_000, 1.0);
        assert_eq!(t.remaining(0, 10_000), 10_000 - 5_100);
        assert_eq!(t.request(1, 2_400), Some(0));
        assert_eq!(t.remaining(0, 10_000), 10_000 - 2_500);
    }

    #[test]
    fn acting_decay_resumes_into_the_room_of_programs_acting_for_seconds_and_the_pause_step_counts_them_whole() {
        // Two programs of 4,000 act on a 10,000-token backend; a paused one of 3,000 waits with
        // its request pending.
        let setup = |decay: bool| {
            let l = vec![load(10_000, 0, 0)];
            let mut t = ThunderAgent::new().with_acting_decay(decay);
            assert_eq!(t.arrive(1, 4_000, &l), Some(0));
            assert_eq!(t.arrive(2, 4_000, &l), Some(0));
            assert_eq!(t.arrive(3, 3_000, &l), None);
            t.response_done(1, 4_000, 0.0);
            t.response_done(2, 4_000, 0.0);
            (t, l)
        };
        // Without decay: 10,000 − 8,200 = 1,800 left, program 3 (3,100) stays paused.
        let (mut t, l) = setup(false);
        assert!(t.tick(&l, 5.0).is_empty());
        // With decay, 5 s after they entered ACTING each acting program counts 4,000 / 32 = 125
        // tokens at resume: 10,000 − 250 − 200 = 9,550 left, and program 3 resumes.
        let (mut t, l) = setup(true);
        assert_eq!(t.remaining_for_resume(0, 10_000, 5.0), 9_550);
        assert_eq!(t.tick(&l, 5.0), [(3, 0)]);
        // The pause step counts the acting programs whole: 11,300 > 10,000, and the smallest
        // acting program is paused (program 3 reasons: its request is pending).
        assert_eq!(t.programs[&3].backend, Some(0));
        assert_eq!(t.programs.values().filter(|p| p.backend.is_none()).count(), 1);
        assert!(t.remaining(0, 10_000) >= 0);
        // At the instant a program starts acting its tokens count whole either way.
        let (t, _) = setup(true);
        assert_eq!(t.remaining_for_resume(0, 10_000, 0.0), t.remaining(0, 10_000));
    }
}

#[cfg(test)]
mod balance_tests {
    use super::*;

    fn cand(session: u64, weight: u64, credits: &[u64]) -> Candidate {
        Candidate {
            session,
            signature: 0,
            weight,
            ready: true,
            tokens: weight,
            options: credits.iter().copied().enumerate().collect(),
        }
    }

    #[test]
    fn sessions_without_cache_evidence_spread_over_the_freest_replicas() {
        let problem = Problem {
            candidates: (0..4).map(|i| cand(i, 2_048, &[0, 0])).chain([cand(9, 2_048, &[5_000, 0])]).collect(),
            capacities: vec![6 * 2_048, 6 * 2_048],
            quantum: 2_048,
            state_budget: 10_000,
        };
        let solved = tao::solve(&problem).unwrap();
        let balanced = balance_ties(&problem, solved.clone());
        assert_eq!(balanced.objective, solved.objective);
        assert_eq!(balanced.assignments.len(), 5);
        // Session 9 keeps its credit replica (residuals then 5 and 6 units); the four ties go
        // one at a time to the freest: 1, 0, 1, 0.
        assert_eq!(balanced.assignments.iter().find(|a| a.session == 9).unwrap().replica, 0);
        let on = |b: usize| balanced.assignments.iter().filter(|a| a.replica == b).count();
        assert_eq!((on(0), on(1)), (3, 2), "{:?}", balanced.assignments);
    }
}
