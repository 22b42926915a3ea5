//! Locality: nodes ranked by the bytes they hold of some files, and the
//! same answer in the shape of a Kubernetes scheduler extender, so a real
//! cluster's scheduler can place a pod where its inputs are.
//!
//! A pod names its F3 inputs in the annotation [`INPUTS_ANNOTATION`]
//! (comma-separated paths). `filter` keeps the candidate nodes that run a
//! live F3 agent; `prioritize` scores each candidate 0 to
//! [`MAX_EXTENDER_PRIORITY`] by the share of the inputs' bytes it holds.
//! The JSON is Kubernetes' `ExtenderArgs`, `ExtenderFilterResult` and
//! `HostPriorityList` (k8s.io/kube-scheduler/extender/v1), whose Go
//! fields have no JSON tags: their names are capitalized.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::path::NamespacePath;
use crate::protocol::{NodeBytes, MAX_FILES_PER_REQUEST};
use crate::{F3Error, Result};

/// The pod annotation that names its F3 inputs, comma-separated.
pub const INPUTS_ANNOTATION: &str = "f3.strata.io/inputs";

/// The highest score an extender gives (Kubernetes' MaxExtenderPriority).
pub const MAX_EXTENDER_PRIORITY: i64 = 10;

/// Most candidate nodes one extender request names.
pub const MAX_CANDIDATES: usize = 5000;

/// Nodes by bytes held, most first (then by name); `alive` says whether
/// a node's lease is current. Nodes holding nothing are left out.
pub fn rank(bytes: BTreeMap<String, u64>, alive: impl Fn(&str) -> bool) -> Vec<NodeBytes> {
    let mut nodes: Vec<NodeBytes> = bytes
        .into_iter()
        .filter(|(_, b)| *b > 0)
        .map(|(node, bytes)| NodeBytes {
            alive: alive(&node),
            node,
            bytes,
        })
        .collect();
    nodes.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.node.cmp(&b.node)));
    nodes
}

/// Kubernetes' `ExtenderArgs`: the pod and its candidate nodes, as full
/// objects (`Nodes`) or names (`NodeNames`, when the extender is
/// `nodeCacheCapable`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExtenderArgs {
    /// The pod to place.
    #[serde(rename = "Pod")]
    pub pod: Pod,
    /// The candidates as a `v1.NodeList`.
    #[serde(rename = "Nodes", default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeList>,
    /// The candidates by name.
    #[serde(rename = "NodeNames", default, skip_serializing_if = "Option::is_none")]
    pub node_names: Option<Vec<String>>,
}

/// The parts of a `v1.Pod` the extender reads.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Pod {
    /// Its metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
}

/// The parts of a `metav1.ObjectMeta` the extender reads.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ObjectMeta {
    /// The object's name.
    #[serde(default)]
    pub name: String,
    /// Its annotations.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// A `v1.NodeList`: its items are kept as they came, and given back as
/// they came by `filter`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct NodeList {
    /// The nodes, whole.
    #[serde(default)]
    pub items: Vec<serde_json::Value>,
}

/// Kubernetes' `ExtenderFilterResult`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ExtenderFilterResult {
    /// The nodes that pass, as objects (when the request gave objects).
    #[serde(rename = "Nodes", skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeList>,
    /// The nodes that pass, by name (when the request gave names).
    #[serde(rename = "NodeNames", skip_serializing_if = "Option::is_none")]
    pub node_names: Option<Vec<String>>,
    /// The nodes that fail, with the reason.
    #[serde(rename = "FailedNodes")]
    pub failed_nodes: BTreeMap<String, String>,
    /// Nodes that fail whatever preemption does (none here).
    #[serde(rename = "FailedAndUnresolvableNodes")]
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    /// An error that fails the whole request.
    #[serde(rename = "Error")]
    pub error: String,
}

/// One entry of Kubernetes' `HostPriorityList`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPriority {
    /// The node's name.
    #[serde(rename = "Host")]
    pub host: String,
    /// Its score, 0 to [`MAX_EXTENDER_PRIORITY`].
    #[serde(rename = "Score")]
    pub score: i64,
}

impl ExtenderArgs {
    /// The candidates' names, in order, checked and bounded.
    pub fn candidates(&self) -> Result<Vec<String>> {
        let names: Vec<String> = match (&self.node_names, &self.nodes) {
            (Some(names), _) => names.clone(),
            (None, Some(list)) => list
                .items
                .iter()
                .map(|item| {
                    item.pointer("/metadata/name")
                        .and_then(|v| v.as_str())
                        .map(str::to_string)
                        .ok_or_else(|| {
                            F3Error::invalid("a node in Nodes.items has no metadata.name")
                        })
                })
                .collect::<Result<_>>()?,
            (None, None) => {
                return Err(F3Error::invalid(
                    "ExtenderArgs names no candidate nodes: give Nodes or NodeNames",
                ))
            }
        };
        if names.len() > MAX_CANDIDATES {
            return Err(F3Error::invalid(format!(
                "ExtenderArgs names {} nodes; at most {MAX_CANDIDATES}",
                names.len()
            )));
        }
        Ok(names)
    }

    /// The pod's F3 inputs, from [`INPUTS_ANNOTATION`] (none without it).
    pub fn inputs(&self) -> Result<Vec<NamespacePath>> {
        let Some(list) = self.pod.metadata.annotations.get(INPUTS_ANNOTATION) else {
            return Ok(Vec::new());
        };
        let paths: Vec<&str> = list
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .collect();
        if paths.len() > MAX_FILES_PER_REQUEST {
            return Err(F3Error::invalid(format!(
                "pod {}: annotation {INPUTS_ANNOTATION} names {} files; at most \
                 {MAX_FILES_PER_REQUEST}",
                self.pod.metadata.name,
                paths.len()
            )));
        }
        paths
            .into_iter()
            .map(|p| {
                NamespacePath::parse(p).map_err(|e| {
                    F3Error::invalid(format!(
                        "pod {}: annotation {INPUTS_ANNOTATION}: {e}",
                        self.pod.metadata.name
                    ))
                })
            })
            .collect()
    }
}

/// `filter`: the candidates that run a live F3 agent pass; the others
/// fail with the reason. `alive` maps registered nodes to their lease.
pub fn filter(args: &ExtenderArgs, alive: &HashMap<String, bool>) -> Result<ExtenderFilterResult> {
    let candidates = args.candidates()?;
    let mut result = ExtenderFilterResult::default();
    let mut passing = Vec::new();
    for name in &candidates {
        match alive.get(name) {
            Some(true) => passing.push(name.clone()),
            Some(false) => {
                result.failed_nodes.insert(
                    name.clone(),
                    "its F3 agent (strata node) missed its heartbeats".into(),
                );
            }
            None => {
                result
                    .failed_nodes
                    .insert(name.clone(), "no F3 agent (strata node) runs there".into());
            }
        }
    }
    if args.node_names.is_some() {
        result.node_names = Some(passing);
    } else if let Some(list) = &args.nodes {
        let items = list
            .items
            .iter()
            .filter(|item| {
                item.pointer("/metadata/name")
                    .and_then(|v| v.as_str())
                    .is_some_and(|n| passing.iter().any(|p| p == n))
            })
            .cloned()
            .collect();
        result.nodes = Some(NodeList { items });
    }
    Ok(result)
}

/// `prioritize`: each candidate's score is its share of the bytes the
/// best-placed candidate holds, scaled to 0..=[`MAX_EXTENDER_PRIORITY`].
pub fn prioritize(args: &ExtenderArgs, held: &[NodeBytes]) -> Result<Vec<HostPriority>> {
    let candidates = args.candidates()?;
    let bytes = |name: &str| held.iter().find(|n| n.node == name).map_or(0, |n| n.bytes);
    let most = candidates.iter().map(|c| bytes(c)).max().unwrap_or(0);
    Ok(candidates
        .iter()
        .map(|name| HostPriority {
            host: name.clone(),
            score: if most == 0 {
                0
            } else {
                (u128::from(bytes(name)) * MAX_EXTENDER_PRIORITY as u128 / u128::from(most)) as i64
            },
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_by_bytes_then_name_and_drops_empty_holders() {
        let bytes = BTreeMap::from([
            ("b".to_string(), 10),
            ("a".to_string(), 10),
            ("c".to_string(), 30),
            ("d".to_string(), 0),
        ]);
        let ranked = rank(bytes, |n| n != "a");
        let names: Vec<&str> = ranked.iter().map(|n| n.node.as_str()).collect();
        assert_eq!(names, ["c", "a", "b"]);
        assert!(!ranked[1].alive);
    }

    #[test]
    fn prioritize_scales_to_the_best_holder() {
        let args: ExtenderArgs =
            serde_json::from_str(r#"{"Pod":{"metadata":{"name":"p"}},"NodeNames":["a","b","c"]}"#)
                .unwrap();
        let held = vec![
            NodeBytes {
                node: "a".into(),
                bytes: 400,
                alive: true,
            },
            NodeBytes {
                node: "b".into(),
                bytes: 100,
                alive: true,
            },
        ];
        let scores = prioritize(&args, &held).unwrap();
        let got: Vec<i64> = scores.iter().map(|h| h.score).collect();
        assert_eq!(got, [10, 2, 0]);
    }
}
