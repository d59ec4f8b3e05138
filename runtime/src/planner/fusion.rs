//! Constructor, part 1: maximal fusible chains (paper 003 Eq. 3) and their admission envelope
//! (Eq. 4). Eq. 4's summed run time is the joint policy's: it times a chain's link with the
//! later links the shell lists in `WorkItem::chain_rest`, at the output history it keeps.
//!
//! Pure functions over a small logical-graph description, so they are tested on hand-built
//! graphs and used by the shells on the workflow DAG. An edge (u, v) is fusible when both are
//! agent nodes, u's only successor is v, v's only predecessor is u, the edge is unconditional,
//! and both use the same deployment identity (serving configurations compatible up to output
//! limits — the identity already encodes model, dtype and serving configuration). Maximal
//! chains of fusible edges are contracted into one scheduling unit that is admitted once and
//! keeps one lease, while every activation keeps its own prompt, output and commit point.
//!
//! Part of the pure core: must not depend on anything outside `planner` but `crate::ids` and the
//! predictor crate (the core's rule, checked by `runtime/tests/module_boundaries.rs`).

/// One node of the logical graph, as the Constructor needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct LogicalNode {
    /// Agent (LLM) node; tool nodes are never fused.
    pub is_agent: bool,
    /// Deployment identity (any stable key); `None` for tools.
    pub deployment: Option<u32>,
    /// Bound on the fixed tokenized input P_i (template text and session inputs).
    pub prompt_bound: u32,
    /// Output limit O_i.
    pub output_limit: u32,
}

/// A directed edge of the logical graph.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogicalEdge {
    pub from: usize,
    pub to: usize,
    /// The edge carries a branch condition (a branch boundary is never fused).
    pub conditional: bool,
}

/// Maximal fusible chains, each as node indices in execution order; chains of length 1 are
/// omitted. Eq. 3: u, v agents; succ(u) = {v}; pred(v) = {u}; d(u) = d(v); unconditional.
pub fn fusible_chains(nodes: &[LogicalNode], edges: &[LogicalEdge]) -> Vec<Vec<usize>> {
    let n = nodes.len();
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut pred: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut conditional = vec![false; n];
    for e in edges {
        if e.from < n && e.to < n {
            succ[e.from].push(e.to);
            pred[e.to].push(e.from);
            if e.conditional {
                conditional[e.to] = true;
            }
        }
    }
    let fusible = |u: usize, v: usize| {
        nodes[u].is_agent
            && nodes[v].is_agent
            && succ[u].len() == 1
            && succ[u][0] == v
            && pred[v].len() == 1
            && pred[v][0] == u
            && !conditional[v]
            && nodes[u].deployment.is_some()
            && nodes[u].deployment == nodes[v].deployment
            && u != v
    };
    let next = |u: usize| succ[u].first().copied().filter(|&v| fusible(u, v));
    let has_fusible_pred = |v: usize| pred[v].len() == 1 && fusible(pred[v][0], v);
    let mut chains = Vec::new();
    for head in 0..n {
        if has_fusible_pred(head) {
            continue;
        }
        let mut chain = vec![head];
        let mut u = head;
        while let Some(v) = next(u) {
            if chain.contains(&v) {
                break; // a cycle of fusible edges: stop rather than loop
            }
            chain.push(v);
            u = v;
        }
        if chain.len() > 1 {
            chains.push(chain);
        }
    }
    chains
}

/// Admission envelope of a chain (Eq. 4): with Ī_i = P_i + Σ_{j ∈ A_i} O_j, where `consumes[i]`
/// lists the earlier chain positions whose outputs activation i reads,
/// I_adm = max_i Ī_i and O_adm = max_i O_i.
pub fn envelope(links: &[LogicalNode], consumes: &[Vec<usize>]) -> (u32, u32) {
    let mut i_adm = 0u32;
    let mut o_adm = 0u32;
    for (i, link) in links.iter().enumerate() {
        // Saturating: a prompt may read the same earlier output many times (each reference
        // counts), and u32 limits summed over them can pass u32::MAX.
        let earlier: u32 = consumes
            .get(i)
            .map(|js| js.iter().filter(|&&j| j < i).fold(0u32, |a, &j| a.saturating_add(links[j].output_limit)))
            .unwrap_or(0);
        i_adm = i_adm.max(link.prompt_bound.saturating_add(earlier));
        o_adm = o_adm.max(link.output_limit);
    }
    (i_adm, o_adm)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(d: u32) -> LogicalNode {
        LogicalNode { is_agent: true, deployment: Some(d), prompt_bound: 100, output_limit: 50 }
    }

    fn tool() -> LogicalNode {
        LogicalNode { is_agent: false, deployment: None, prompt_bound: 0, output_limit: 0 }
    }

    fn e(from: usize, to: usize) -> LogicalEdge {
        LogicalEdge { from, to, conditional: false }
    }

    #[test]
    fn qmsum_shape_fuses_two_lanes_and_the_aggregation_chain() {
        // Lanes 0→1→2 and 3→4→5 on deployment 4; join into 6→7→8 on deployment 8.
        let nodes = vec![agent(4), agent(4), agent(4), agent(4), agent(4), agent(4), agent(8), agent(8), agent(8)];
        let edges = vec![e(0, 1), e(1, 2), e(3, 4), e(4, 5), e(2, 6), e(5, 6), e(6, 7), e(7, 8)];
        assert_eq!(fusible_chains(&nodes, &edges), vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7, 8]]);
    }

    #[test]
    fn branches_joins_tools_and_other_deployments_are_boundaries() {
        // 0 forks into 1 and 2 (same deployment): no fusion across a fork.
        let nodes = vec![agent(1), agent(1), agent(1)];
        assert!(fusible_chains(&nodes, &[e(0, 1), e(0, 2)]).is_empty());
        // 0 and 1 join into 2: no fusion across a join.
        assert!(fusible_chains(&nodes, &[e(0, 2), e(1, 2)]).is_empty());
        // A tool in between breaks the chain.
        let nodes = vec![agent(1), tool(), agent(1)];
        assert!(fusible_chains(&nodes, &[e(0, 1), e(1, 2)]).is_empty());
        // A different deployment breaks it.
        let nodes = vec![agent(1), agent(2), agent(2)];
        assert_eq!(fusible_chains(&nodes, &[e(0, 1), e(1, 2)]), vec![vec![1, 2]]);
        // A conditional edge (branch chosen by a result) is never fused.
        let nodes = vec![agent(1), agent(1)];
        let cond = LogicalEdge { from: 0, to: 1, conditional: true };
        assert!(fusible_chains(&nodes, &[cond]).is_empty());
    }

    #[test]
    fn a_fusible_cycle_terminates() {
        let nodes = vec![agent(1), agent(1)];
        let chains = fusible_chains(&nodes, &[e(0, 1), e(1, 0)]);
        assert!(chains.iter().all(|c| c.len() <= 2));
    }

    #[test]
    fn envelope_counts_consumed_earlier_outputs() {
        let links = vec![
            LogicalNode { is_agent: true, deployment: Some(1), prompt_bound: 1000, output_limit: 300 },
            LogicalNode { is_agent: true, deployment: Some(1), prompt_bound: 800, output_limit: 200 },
            LogicalNode { is_agent: true, deployment: Some(1), prompt_bound: 100, output_limit: 500 },
        ];
        // Link 1 reads link 0's output; link 2 reads both.
        let consumes = vec![vec![], vec![0], vec![0, 1]];
        // Ī = [1000, 800 + 300, 100 + 300 + 200] = [1000, 1100, 600]; O = max(300, 200, 500).
        assert_eq!(envelope(&links, &consumes), (1100, 500));
        // Forward references are ignored.
        assert_eq!(envelope(&links, &[vec![2], vec![], vec![]]), (1000, 500));
        // A prompt that reads an earlier output many times counts it each time, saturating
        // (a review's workflow: 110,000 references to a 40,900-token output passed u32::MAX).
        let big = vec![
            LogicalNode { is_agent: true, deployment: Some(1), prompt_bound: 0, output_limit: 40_900 },
            LogicalNode { is_agent: true, deployment: Some(1), prompt_bound: 0, output_limit: 1 },
        ];
        assert_eq!(envelope(&big, &[vec![], vec![0; 110_000]]), (u32::MAX, 40_900));
    }
}
