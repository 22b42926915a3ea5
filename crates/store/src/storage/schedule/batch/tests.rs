use super::*;
use proptest::prelude::*;

const BUDGET: u64 = 64 * 1024;

fn scheduler(weights: &[(&str, u32)]) -> Scheduler {
    Scheduler::new(ScheduleConfig {
        enabled: true,
        batch_bytes: BUDGET,
        weights: weights
            .iter()
            .map(|&(name, weight)| (name.to_string(), weight))
            .collect(),
        default_weight: 1,
        classes: Default::default(),
    })
    .unwrap()
}

fn class(name: &str) -> ClassId {
    ClassId::new(name)
}

/// Runs one batch as an I/O shell whose sends all succeed.
fn send_batch(scheduler: &mut Scheduler) -> Batch {
    let batch = scheduler.next_batch();
    for slice in &batch.slices {
        let progress = scheduler
            .record_sent(slice.request, slice.length_bytes)
            .unwrap();
        assert_eq!(progress == Progress::Done, slice.last, "{slice:?}");
    }
    batch
}

fn bytes_of(batch: &Batch, name: &str) -> u64 {
    batch
        .slices
        .iter()
        .filter(|slice| slice.class.as_str() == name)
        .map(|slice| slice.length_bytes)
        .sum()
}

#[test]
fn a_class_small_requests_pass_its_big_one_in_the_first_batch() {
    let mut scheduler = scheduler(&[]);
    let big = scheduler.enqueue(&class("a"), 10 << 20).unwrap();
    let small: Vec<RequestId> = (0..3)
        .map(|_| scheduler.enqueue(&class("a"), 4096).unwrap())
        .collect();
    let batch = send_batch(&mut scheduler);
    for request in &small {
        let slice = batch
            .slices
            .iter()
            .find(|slice| slice.request == *request)
            .unwrap();
        assert!(slice.last && slice.length_bytes == 4096, "{slice:?}");
    }
    let big_slice = batch
        .slices
        .iter()
        .find(|slice| slice.request == big)
        .unwrap();
    assert_eq!(big_slice.length_bytes, BUDGET - 3 * 4096);
    assert_eq!(scheduler.pending_requests(), 1);
}

#[test]
fn a_class_wanting_less_than_its_share_leaves_the_rest_to_the_other() {
    let mut scheduler = scheduler(&[]);
    scheduler.enqueue(&class("a"), 1024).unwrap();
    scheduler.enqueue(&class("b"), 1 << 30).unwrap();
    let batch = send_batch(&mut scheduler);
    assert_eq!(bytes_of(&batch, "a"), 1024);
    assert_eq!(bytes_of(&batch, "b"), BUDGET - 1024);
}

#[test]
fn a_class_sending_many_requests_gets_no_more_than_a_class_sending_one() {
    // The thesis's first fairness example: parallel requests buy nothing.
    let mut scheduler = scheduler(&[]);
    for _ in 0..16 {
        scheduler.enqueue(&class("greedy"), 1 << 20).unwrap();
    }
    scheduler.enqueue(&class("modest"), 1 << 20).unwrap();
    let batch = send_batch(&mut scheduler);
    assert_eq!(bytes_of(&batch, "greedy"), BUDGET / 2);
    assert_eq!(bytes_of(&batch, "modest"), BUDGET / 2);
}

#[test]
fn weights_one_two_three_share_saturated_batches_in_proportion() {
    let mut scheduler = scheduler(&[("a", 1), ("b", 2), ("c", 3)]);
    for name in ["a", "b", "c"] {
        scheduler.enqueue(&class(name), 1 << 30).unwrap();
    }
    let mut totals = [0u64; 3];
    for _ in 0..6 {
        let batch = send_batch(&mut scheduler);
        assert_eq!(batch.total_bytes(), BUDGET);
        for (total, name) in totals.iter_mut().zip(["a", "b", "c"]) {
            *total += bytes_of(&batch, name);
        }
    }
    // 6 batches of 65536 bytes: exactly 1:2:3 up to one byte a batch.
    let exact = [65_536u64, 131_072, 196_608];
    for (total, exact) in totals.iter().zip(exact) {
        assert!(total.abs_diff(exact) <= 6, "{totals:?}");
    }
}

#[test]
fn a_request_bigger_than_the_budget_completes_within_a_bounded_number_of_batches() {
    let mut scheduler = scheduler(&[]);
    let big = scheduler.enqueue(&class("a"), 5 * BUDGET).unwrap();
    for name in ["b", "c", "d"] {
        scheduler.enqueue(&class(name), u64::MAX).unwrap();
    }
    // Four saturated classes: a gets a quarter of each batch, so 20.
    let mut batches = 0;
    loop {
        let batch = send_batch(&mut scheduler);
        batches += 1;
        if batch
            .slices
            .iter()
            .any(|slice| slice.request == big && slice.last)
        {
            break;
        }
        assert!(batches < 20, "still not done after {batches} batches");
    }
    assert_eq!(batches, 20);
}

#[test]
fn a_full_send_buffer_takes_no_budget_and_a_small_one_caps_the_grant() {
    let mut scheduler = scheduler(&[]);
    let blocked = scheduler.enqueue(&class("a"), 1 << 20).unwrap();
    let capped = scheduler.enqueue(&class("b"), 1 << 20).unwrap();
    scheduler.enqueue(&class("c"), 1 << 20).unwrap();
    scheduler.set_send_room(blocked, Some(0)).unwrap();
    scheduler.set_send_room(capped, Some(1000)).unwrap();
    let batch = send_batch(&mut scheduler);
    assert!(batch.slices.iter().all(|slice| slice.request != blocked));
    assert_eq!(bytes_of(&batch, "b"), 1000);
    assert_eq!(bytes_of(&batch, "c"), BUDGET - 1000);
    // The 1000 bytes sent filled b's buffer: nothing for b until the shell
    // reads its room again.
    let batch = send_batch(&mut scheduler);
    assert_eq!(bytes_of(&batch, "b"), 0);
    scheduler.set_send_room(capped, None).unwrap();
    scheduler.set_send_room(blocked, None).unwrap();
    let batch = send_batch(&mut scheduler);
    assert_eq!(batch.total_bytes(), BUDGET);
    assert!(bytes_of(&batch, "a") > 0 && bytes_of(&batch, "b") > 0);
}

#[test]
fn bytes_not_reported_sent_are_offered_again_at_the_same_offset() {
    let mut scheduler = scheduler(&[]);
    let request = scheduler.enqueue(&class("a"), 1 << 20).unwrap();
    let first = scheduler.next_batch();
    assert_eq!(first.slices[0].offset_bytes, 0);
    let progress = scheduler.record_sent(request, 100).unwrap();
    assert_eq!(
        progress,
        Progress::Pending {
            remaining_bytes: (1 << 20) - 100
        }
    );
    let second = scheduler.next_batch();
    assert_eq!(second.slices[0].offset_bytes, 100);
    assert_eq!(second.number, first.number + 1);
}

#[test]
fn an_empty_object_completes_with_an_empty_last_slice() {
    let mut scheduler = scheduler(&[]);
    let request = scheduler.enqueue(&class("a"), 0).unwrap();
    scheduler.enqueue(&class("b"), 1 << 20).unwrap();
    let batch = send_batch(&mut scheduler);
    let slice = batch
        .slices
        .iter()
        .find(|slice| slice.request == request)
        .unwrap();
    assert!(slice.last && slice.length_bytes == 0);
    assert_eq!(bytes_of(&batch, "b"), BUDGET);
    assert_eq!(scheduler.pending_requests(), 1);
}

#[test]
fn wrong_reports_and_unknown_requests_are_refused_with_what_was_wrong() {
    let mut scheduler = scheduler(&[]);
    let request = scheduler.enqueue(&class("a"), 10).unwrap();
    let error = scheduler.record_sent(request, 11).unwrap_err();
    assert!(error.to_string().contains("had only 10 left"), "{error}");
    scheduler.cancel(request).unwrap();
    assert_eq!(scheduler.pending_requests(), 0);
    assert_eq!(
        scheduler.cancel(request),
        Err(ScheduleError::UnknownRequest(request))
    );
    assert_eq!(
        scheduler.set_send_room(request, None),
        Err(ScheduleError::UnknownRequest(request))
    );
    assert_eq!(scheduler.next_batch().slices, vec![]);
}

#[test]
fn pending_requests_and_active_classes_are_bounded() {
    let mut scheduler = scheduler(&[]);
    for n in 0..MAX_ACTIVE_CLASSES {
        scheduler.enqueue(&class(&format!("t{n}")), 1).unwrap();
    }
    let error = scheduler.enqueue(&class("newcomer"), 1).unwrap_err();
    assert_eq!(error, ScheduleError::TooManyClasses(class("newcomer")));
    for _ in MAX_ACTIVE_CLASSES..MAX_PENDING_REQUESTS {
        scheduler.enqueue(&class("t0"), 1).unwrap();
    }
    assert_eq!(scheduler.enqueue(&class("t0"), 1), Err(ScheduleError::Full));
    // One batch serves at most the window of every class.
    let batch = scheduler.next_batch();
    assert!(batch.slices.len() <= MAX_ACTIVE_CLASSES - 1 + CLASS_WINDOW_REQUESTS);
}

#[test]
fn an_invalid_configuration_builds_no_scheduler() {
    let config = ScheduleConfig {
        batch_bytes: 1,
        ..ScheduleConfig::default()
    };
    assert_eq!(
        Scheduler::new(config).unwrap_err(),
        ConfigError::BatchBytes(1)
    );
}

/// Requests as (class number, size).
fn arbitrary_requests() -> impl Strategy<Value = Vec<(u8, u64)>> {
    prop::collection::vec((0u8..6, prop_oneof![0u64..5_000, 0u64..600_000]), 1..60)
}

fn drain(requests: &[(u8, u64)], weights: &[(&str, u32)]) -> (Vec<Batch>, usize) {
    let mut scheduler = scheduler(weights);
    for &(number, size) in requests {
        scheduler
            .enqueue(&class(&format!("c{number}")), size)
            .unwrap();
    }
    let mut batches = Vec::new();
    while scheduler.pending_requests() > 0 && batches.len() < 10_000 {
        batches.push(send_batch(&mut scheduler));
    }
    (batches, scheduler.pending_requests())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_batch_is_full_until_the_queues_drain_and_every_byte_is_sent_once(
        requests in arbitrary_requests()
    ) {
        let weights = [("c0", 1), ("c1", 7), ("c2", 1000)];
        let (batches, left) = drain(&requests, &weights);
        prop_assert_eq!(left, 0);
        let total: u64 = requests.iter().map(|&(_, size)| size).sum();
        // Full batches but the last: the fewest batches that can carry it.
        prop_assert_eq!(batches.len() as u64, total.div_ceil(BUDGET).max(1));
        for batch in &batches[..batches.len() - 1] {
            prop_assert_eq!(batch.total_bytes(), BUDGET);
        }
        prop_assert_eq!(batches.iter().map(Batch::total_bytes).sum::<u64>(), total);
    }

    #[test]
    fn the_same_requests_give_the_same_batches(requests in arbitrary_requests()) {
        prop_assert_eq!(drain(&requests, &[("c3", 5)]), drain(&requests, &[("c3", 5)]));
    }
}

#[test]
fn new_weights_apply_to_requests_already_pending() {
    let mut scheduler = scheduler(&[]);
    for class in ["a", "b"] {
        scheduler
            .enqueue(&ClassId::new(class), 10 * BUDGET)
            .expect("queued");
    }
    let even = scheduler.next_batch();
    let bytes_of = |batch: &Batch, class: &str| -> u64 {
        batch
            .slices
            .iter()
            .filter(|slice| slice.class.as_str() == class)
            .map(|slice| slice.length_bytes)
            .sum()
    };
    assert_eq!(bytes_of(&even, "a"), bytes_of(&even, "b"));
    let mut config = scheduler.config().clone();
    config.weights.insert("a".into(), 3);
    scheduler.reconfigure(config).expect("valid settings");
    let weighted = scheduler.next_batch();
    assert_eq!(bytes_of(&weighted, "a"), 3 * bytes_of(&weighted, "b"));
    let mut bad = scheduler.config().clone();
    bad.batch_bytes = 1;
    assert!(scheduler.reconfigure(bad).is_err());
    assert_eq!(scheduler.config().batch_bytes, BUDGET);
}
