//! A batch's byte budget shared between classes by weighted
//! water-filling (thesis §4.2.3, Algorithm 2, and §4.5.2, W-RS3).
//!
//! Every class gets the smaller of its demand and its weighted share of
//! what is left; what a class leaves unused is handed to the classes
//! still wanting, in proportion to their weights. With equal weights this
//! is the thesis's Algorithm 2 exactly.
//!
//! Where this differs from the thesis: Algorithm 4 (W-RS3) grants class
//! `i` (ordered by `R[i]/w_i`) `R_b·w_i·N/(N−i)`, which hands out the whole
//! budget only when the weights are equal. With weights 1:2:3, a budget of
//! 600 and three saturated classes it grants 300, 150 and 75: 525 bytes,
//! and not in proportion 1:2:3. Here class `i` is granted
//! `R_b·w_i/Σ_{j≥i} w_j` (the remaining budget shared by the weights still
//! in play), which grants 100, 200 and 300. The thesis's send-buffer room
//! `T[i]` is not a separate argument: the caller folds it into the demand
//! (`demand = min(R[i], T[i])`), which also orders the classes correctly
//! when the send buffer is what limits a class.
//!
//! Integer bytes: the classes still wanting after water-filling get
//! `floor(R_b·w_i/W)` each, and the few bytes those floors leave (fewer than
//! the number of such classes) go one each to consecutive classes starting
//! at `rotation`. So every grant is within one byte of its exact weighted
//! share, and a class whose exact share is below one byte still gets a
//! byte every few batches instead of never.

use crate::storage::schedule::ClassId;
use std::cmp::Ordering;

/// One class's claim on a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassDemand {
    /// The class.
    pub class: ClassId,
    /// Its weight; 0 counts as 1 (a configuration is validated to 1..=1000).
    pub weight: u32,
    /// Bytes it could use in this batch: its pending bytes, capped by the
    /// room in its send buffers.
    pub demand_bytes: u64,
}

/// Shares `budget_bytes` between `demands` by weighted water-filling (see
/// the module documentation). Returns each class with its grant, in the
/// order of `demands`. The result does not depend on the order of
/// `demands` (ties are broken by class name), only on `rotation`, which
/// chooses who gets the rounding bytes: pass the batch number.
///
/// Guarantees: the grants add up to `min(budget_bytes, Σ demand)`; no
/// grant exceeds its demand; a class granted less than its demand gets
/// within one byte of `R_b·w_i/W`, so no class gets more per unit of
/// weight than it, beyond rounding.
pub fn allocate(budget_bytes: u64, demands: &[ClassDemand], rotation: u64) -> Vec<(ClassId, u64)> {
    let mut by_name: Vec<usize> = (0..demands.len()).collect();
    by_name.sort_by(|&a, &b| demands[a].class.cmp(&demands[b].class));
    let claims: Vec<Claim> = by_name
        .iter()
        .map(|&index| Claim {
            weight: demands[index].weight,
            demand_bytes: demands[index].demand_bytes,
        })
        .collect();
    let sorted_grants = water_fill(budget_bytes, &claims, rotation);
    let mut grants = vec![0; demands.len()];
    for (position, &index) in by_name.iter().enumerate() {
        grants[index] = sorted_grants[position];
    }
    demands
        .iter()
        .zip(grants)
        .map(|(demand, grant)| (demand.class.clone(), grant))
        .collect()
}

/// A claim on a budget: a weight and the bytes wanted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Claim {
    /// Weight; 0 counts as 1.
    pub weight: u32,
    /// Bytes wanted.
    pub demand_bytes: u64,
}

impl Claim {
    fn weight(&self) -> u128 {
        u128::from(self.weight.max(1))
    }
}

/// Weighted water-filling over `claims`, grants in the order of `claims`.
/// Ties (equal demand per weight) keep the order of `claims`, and the
/// rounding bytes go to the wanting claims in that order starting at
/// `rotation` (modulo their number). Shared by the class allocation and by
/// the second pass over a class's requests.
pub(crate) fn water_fill(budget_bytes: u64, claims: &[Claim], rotation: u64) -> Vec<u64> {
    let mut grants = vec![0u64; claims.len()];
    let mut order: Vec<usize> = (0..claims.len())
        .filter(|&index| claims[index].demand_bytes > 0)
        .collect();
    // Stable sort by demand per weight, compared without division.
    order.sort_by(|&a, &b| demand_per_weight(&claims[a], &claims[b]));
    let mut remaining = u128::from(budget_bytes);
    let mut weight_left: u128 = order.iter().map(|&index| claims[index].weight()).sum();
    let mut satisfied = 0;
    for &index in &order {
        let claim = &claims[index];
        // Satisfied when its demand fits in its share of what is left:
        // demand ≤ remaining·w/W. Shares only grow as satisfied classes
        // leave, so once one does not fit, none after it does.
        if u128::from(claim.demand_bytes) * weight_left > remaining * claim.weight() {
            break;
        }
        grants[index] = claim.demand_bytes;
        remaining -= u128::from(claim.demand_bytes);
        weight_left -= claim.weight();
        satisfied += 1;
    }
    let mut wanting = order.split_off(satisfied);
    if wanting.is_empty() {
        return grants;
    }
    let mut given = 0u128;
    for &index in &wanting {
        let share = remaining * claims[index].weight() / weight_left;
        // share < demand (the claim did not fit), so it fits in a u64.
        grants[index] = share as u64;
        given += share;
    }
    // Each floor loses less than one byte: fewer leftover bytes than
    // wanting claims, and each such claim's demand exceeds its exact share,
    // so floor + 1 stays within its demand.
    let leftover = (remaining - given) as usize;
    debug_assert!(leftover < wanting.len());
    wanting.sort_unstable();
    let start = (rotation % wanting.len() as u64) as usize;
    for step in 0..leftover {
        let index = wanting[(start + step) % wanting.len()];
        grants[index] += 1;
        debug_assert!(grants[index] <= claims[index].demand_bytes);
    }
    debug_assert!(
        grants.iter().map(|&grant| u128::from(grant)).sum::<u128>() <= u128::from(budget_bytes)
    );
    grants
}

/// Orders two claims by demand per unit of weight, smallest first.
fn demand_per_weight(a: &Claim, b: &Claim) -> Ordering {
    (u128::from(a.demand_bytes) * b.weight()).cmp(&(u128::from(b.demand_bytes) * a.weight()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn demand(name: &str, weight: u32, demand_bytes: u64) -> ClassDemand {
        ClassDemand {
            class: ClassId::new(name),
            weight,
            demand_bytes,
        }
    }

    fn grants(budget: u64, demands: &[ClassDemand], rotation: u64) -> Vec<u64> {
        allocate(budget, demands, rotation)
            .into_iter()
            .map(|(_, grant)| grant)
            .collect()
    }

    #[test]
    fn a_class_wanting_less_than_its_share_hands_the_rest_to_the_others() {
        // The thesis's figure 4.1 shape: budget 100, three classes.
        let demands = [demand("a", 1, 10), demand("b", 1, 50), demand("c", 1, 80)];
        assert_eq!(grants(100, &demands, 0), vec![10, 45, 45]);
    }

    #[test]
    fn weights_one_two_three_share_the_whole_budget_in_proportion() {
        let demands = [
            demand("a", 1, 1000),
            demand("b", 2, 1000),
            demand("c", 3, 1000),
        ];
        assert_eq!(grants(600, &demands, 0), vec![100, 200, 300]);
    }

    #[test]
    fn the_thesis_weighted_formula_would_leave_budget_unused() {
        // Algorithm 4 as printed, on the same 1:2:3 case, for the record:
        // ordered by R/w (c, b, a), grants R_b·w_i·N/(N−i).
        let weights = [3.0f64 / 6.0, 2.0 / 6.0, 1.0 / 6.0];
        let mut remaining = 600.0;
        let mut thesis = Vec::new();
        for (position, weight) in weights.iter().enumerate() {
            let grant = remaining * weight * 3.0 / (3 - position) as f64;
            thesis.push(grant);
            remaining -= grant;
        }
        assert_eq!(thesis, vec![300.0, 150.0, 75.0]);
        let ours = grants(
            600,
            &[
                demand("a", 1, 1000),
                demand("b", 2, 1000),
                demand("c", 3, 1000),
            ],
            0,
        );
        assert_eq!(ours.iter().sum::<u64>(), 600);
    }

    #[test]
    fn a_satisfied_weighted_class_leaves_its_rest_to_the_others_by_weight() {
        // c (weight 3) wants 150 of its 300: the other 450 go 1:2.
        let demands = [
            demand("a", 1, 1000),
            demand("b", 2, 1000),
            demand("c", 3, 150),
        ];
        assert_eq!(grants(600, &demands, 0), vec![150, 300, 150]);
    }

    #[test]
    fn rounding_bytes_rotate_between_the_wanting_classes() {
        let demands = [
            demand("a", 1, 1000),
            demand("b", 1, 1000),
            demand("c", 1, 1000),
        ];
        assert_eq!(grants(100, &demands, 0), vec![34, 33, 33]);
        assert_eq!(grants(100, &demands, 1), vec![33, 34, 33]);
        assert_eq!(grants(100, &demands, 5), vec![33, 33, 34]);
    }

    #[test]
    fn a_class_whose_share_is_below_one_byte_still_gets_bytes_over_batches() {
        // 1023 classes of weight 1000 and one of weight 1: the light one's
        // exact share is 65536/1023001 ≈ 0.064 bytes a batch, 65.6 per
        // 1024 batches. Rounding bytes rotating give it 64 of them.
        let mut demands: Vec<ClassDemand> = (0..1023)
            .map(|n| demand(&format!("heavy{n:04}"), 1000, u64::MAX))
            .collect();
        demands.push(demand("light", 1, u64::MAX));
        let light_bytes: u64 = (0..1024)
            .map(|rotation| grants(65_536, &demands, rotation)[1023])
            .sum();
        assert_eq!(light_bytes, 64);
    }

    #[test]
    fn nothing_to_share_or_nobody_wanting_grants_nothing() {
        assert!(allocate(100, &[], 0).is_empty());
        assert_eq!(grants(0, &[demand("a", 1, 10)], 0), vec![0]);
        assert_eq!(
            grants(100, &[demand("a", 1, 0), demand("b", 1, 7)], 0),
            vec![0, 7]
        );
    }

    fn arbitrary_demands() -> impl Strategy<Value = Vec<ClassDemand>> {
        let demand_bytes = prop_oneof![0u64..2_000, 0u64..10_000_000, Just(u64::MAX)];
        prop::collection::vec((1u32..=1000, demand_bytes), 0..24).prop_map(|claims| {
            claims
                .into_iter()
                .enumerate()
                .map(|(n, (weight, demand_bytes))| {
                    demand(&format!("class{n:02}"), weight, demand_bytes)
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn the_whole_budget_goes_out_when_demand_allows_and_no_class_over_its_demand(
            budget in 0u64..100_000_000, demands in arbitrary_demands(), rotation in any::<u64>()
        ) {
            let granted = grants(budget, &demands, rotation);
            let total_demand: u128 = demands.iter().map(|d| u128::from(d.demand_bytes)).sum();
            let total: u128 = granted.iter().map(|&g| u128::from(g)).sum();
            prop_assert_eq!(total, total_demand.min(u128::from(budget)));
            for (grant, claim) in granted.iter().zip(&demands) {
                prop_assert!(*grant <= claim.demand_bytes);
            }
        }

        #[test]
        fn no_class_gets_more_per_weight_than_a_class_left_wanting(
            budget in 0u64..100_000_000, demands in arbitrary_demands(), rotation in any::<u64>()
        ) {
            let granted = grants(budget, &demands, rotation);
            for (i, wanting) in demands.iter().enumerate() {
                if granted[i] >= wanting.demand_bytes {
                    continue;
                }
                for (j, other) in demands.iter().enumerate() {
                    // g_j/w_j < g_i/w_i + 1/w_i + 1/w_j (one byte of rounding each).
                    let (wi, wj) = (u128::from(wanting.weight), u128::from(other.weight));
                    prop_assert!(
                        u128::from(granted[j]) * wi < u128::from(granted[i]) * wj + wi + wj,
                        "class {} (w {}) got {} while class {} (w {}) wanting got {}",
                        j, wj, granted[j], i, wi, granted[i]
                    );
                }
            }
        }

        #[test]
        fn equal_weights_all_saturated_get_equal_shares(
            budget in 0u64..100_000_000, count in 1usize..40, weight in 1u32..=1000, rotation in any::<u64>()
        ) {
            let demands: Vec<ClassDemand> = (0..count).map(|n| demand(&format!("c{n}"), weight, u64::MAX)).collect();
            let granted = grants(budget, &demands, rotation);
            let low = budget / count as u64;
            prop_assert!(granted.iter().all(|&g| g == low || g == low + 1));
            prop_assert_eq!(granted.iter().sum::<u64>(), budget);
        }

        #[test]
        fn the_allocation_is_deterministic_and_ignores_the_order_of_classes(
            budget in 0u64..100_000_000, demands in arbitrary_demands(), rotation in any::<u64>()
        ) {
            let forward = allocate(budget, &demands, rotation);
            prop_assert_eq!(&forward, &allocate(budget, &demands, rotation));
            let reversed: Vec<ClassDemand> = demands.iter().rev().cloned().collect();
            let mut backward = allocate(budget, &reversed, rotation);
            backward.reverse();
            prop_assert_eq!(forward, backward);
        }
    }
}
