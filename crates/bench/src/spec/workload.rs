//! The workloads' checks: each names a volume group it can use, and its
//! kind fits how that group is attached (fio on the NBD export or in a
//! file system, pgbench on a file system only).

use std::collections::BTreeMap;

use serde_saphyr::Spanned;

use crate::output_parser::OutputParser;

use super::{
    check_count, check_name, one_of, refused, Attach, FioValue, RawWorkload, SpecError,
    VolumeGroup, Workload, WorkloadKind, MAX_COUNT,
};

/// Checks every workload: its name, count, group, and a kind that fits
/// how the group is attached.
pub(super) fn check_workloads(
    raw: &[RawWorkload],
    groups: &[VolumeGroup],
) -> Result<Vec<Workload>, SpecError> {
    let group_names: Vec<String> = groups.iter().map(|g| g.name.clone()).collect();
    let mut workloads: Vec<Workload> = Vec::new();
    for workload in raw {
        let name = &workload.name;
        check_name(name, "workload")?;
        check_count(name, "workload", workload.count, 1)?;
        if workloads.iter().any(|w| w.name == name.value) {
            return refused(
                name,
                format!(
                    "a second workload named `{}`: give each its own name",
                    name.value
                ),
            );
        }
        let Some(volumes) = &workload.volumes else {
            return refused(
                name,
                format!(
                    "workload `{}` uses no volume: add `volumes: GROUP` naming one of {}",
                    name.value,
                    one_of(&group_names)
                ),
            );
        };
        let Some(group) = groups.iter().find(|g| g.name == volumes.value) else {
            return refused(
                volumes,
                format!(
                    "workload `{}`: `volumes: {}` names no volume group: write one of {}",
                    name.value,
                    volumes.value,
                    one_of(&group_names)
                ),
            );
        };
        if workload.count > group.count {
            return refused(name, format!(
                "workload `{}` has {} instances but volume group `{}` starts with {} volumes: raise that group's count to {} or lower this one",
                name.value, workload.count, group.name, group.count, workload.count
            ));
        }
        workloads.push(Workload {
            name: name.value.clone(),
            count: workload.count,
            volumes: group.name.clone(),
            barrier: workload.barrier,
            kind: workload_kind(workload, group)?,
            parser: output_parser(workload)?,
        });
    }
    Ok(workloads)
}

/// A command workload's output parser, if the spec gives one.
fn output_parser(workload: &RawWorkload) -> Result<Option<OutputParser>, SpecError> {
    let name = &workload.name;
    let Some(parse) = &workload.parse else {
        return Ok(None);
    };
    if workload.command.is_none() {
        return refused(name, format!(
            "workload `{}`: `parse:` reads a command's output; fio and pgbench workloads report their own figures: remove it",
            name.value
        ));
    }
    match OutputParser::new(&parse.pattern, parse.cumulative) {
        Ok(parser) => Ok(Some(parser)),
        Err(why) => refused(name, format!("workload `{}`: parse: {why}", name.value)),
    }
}

/// The one kind a workload states, checked against its group's attach mode.
fn workload_kind(workload: &RawWorkload, group: &VolumeGroup) -> Result<WorkloadKind, SpecError> {
    let name = &workload.name;
    match (&workload.fio, &workload.command, &workload.pgbench) {
        (Some(options), None, None) => Ok(WorkloadKind::Fio(check_fio(name, options, group)?)),
        (None, Some(words), None) if !words.is_empty() => Ok(WorkloadKind::Command(words.clone())),
        (None, None, Some(options)) => {
            if group.attach != Attach::Fs {
                return refused(name, format!(
                    "workload `{}`: pgbench needs a file system: add `attach: fs` to volume group `{}`",
                    name.value, group.name
                ));
            }
            let in_range = |n: u32| (1..=MAX_COUNT).contains(&n);
            if !in_range(options.scale) || !in_range(options.clients) {
                return refused(name, format!(
                    "workload `{}`: pgbench scale and clients: write 1 to {MAX_COUNT} each",
                    name.value
                ));
            }
            Ok(WorkloadKind::Pgbench(*options))
        }
        _ => refused(name, format!(
            "workload `{}`: give exactly one of `fio:` (job options), `command:` (a list of words) or `pgbench:` ({{scale: 1, clients: 2}})",
            name.value
        )),
    }
}

/// fio options the runner sets itself: the spec may not change where the
/// I/O goes or where its results are kept.
const FIO_RESERVED: &[&str] = &[
    "ioengine",
    "uri",
    "filename",
    "name",
    "output",
    "output-format",
    "write_iops_log",
    "write_bw_log",
    "write_lat_log",
    "log_avg_msec",
    "status-interval",
];

fn check_fio(
    name: &Spanned<String>,
    options: &BTreeMap<String, FioValue>,
    group: &VolumeGroup,
) -> Result<BTreeMap<String, String>, SpecError> {
    if let Some(key) = options.keys().find(|k| FIO_RESERVED.contains(&k.as_str())) {
        return refused(name, format!(
            "workload `{}`: fio option `{key}` is set by `strata bench` (the volume's NBD export or mount point, and the run's logs): remove it",
            name.value
        ));
    }
    match group.attach {
        Attach::Nbd if options.contains_key("directory") => refused(name, format!(
            "workload `{}`: fio option `directory` needs a mounted file system, and volume group `{}` is reached over NBD: add `attach: fs` to the group (the run then sets `directory` to its mount point) or remove `directory`",
            name.value, group.name
        )),
        Attach::Fs if options.contains_key("directory") => refused(name, format!(
            "workload `{}`: fio option `directory` is set by `strata bench` to the volume's mount point: remove it",
            name.value
        )),
        Attach::Fs if !options.contains_key("size") => refused(name, format!(
            "workload `{}`: fio on the file system of volume group `{}` writes a file and needs its size: add `size:` (such as 16M), less than the volume's size",
            name.value, group.name
        )),
        _ => Ok(options.iter().map(|(k, v)| (k.clone(), v.text())).collect()),
    }
}

/// How restore-and-verify checks a clone of a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RestoreCheck {
    /// fio's `verify_only` of the workload's blocks over NBD (the run
    /// fills them once at setup, so that every block holds a header and
    /// a checksum from the first snapshot on): these options of the
    /// workload's (block size, size, offset, verify method).
    FioVerify(BTreeMap<String, String>),
    /// `fsck.ext4 -n` of the file system after its journal is replayed;
    /// with `pgbench`, PostgreSQL started on it and pgbench's balances
    /// checked against its history.
    Fsck {
        /// A pgbench workload used the volume.
        pgbench: bool,
    },
}

/// The workload options fio's verify of a clone repeats.
const VERIFY_OPTIONS: &[&str] = &[
    "bs",
    "blocksize",
    "size",
    "offset",
    "verify",
    "verify_interval",
    "verify_pattern",
    "verify_offset",
];

/// Block size options a verify pass could not repeat block for block.
const MIXED_BLOCK_SIZES: &[&str] = &[
    "bsrange",
    "blocksize_range",
    "bssplit",
    "blocksize_unaligned",
    "bs_unaligned",
];

/// How a clone of a volume of `group` that `workload` used is checked,
/// if it can be.
pub fn restore_check(group: &VolumeGroup, workload: Option<&Workload>) -> Option<RestoreCheck> {
    match (group.attach, workload.map(|w| &w.kind)) {
        (Attach::Fs, kind) => Some(RestoreCheck::Fsck {
            pgbench: matches!(kind, Some(WorkloadKind::Pgbench(_))),
        }),
        (Attach::Nbd, Some(WorkloadKind::Fio(options))) => {
            let verifies = options
                .get("verify")
                .is_some_and(|v| !matches!(v.as_str(), "0" | "none" | ""));
            let mixed = MIXED_BLOCK_SIZES.iter().any(|k| options.contains_key(*k));
            (verifies && !mixed).then(|| {
                RestoreCheck::FioVerify(
                    options
                        .iter()
                        .filter(|(k, _)| VERIFY_OPTIONS.contains(&k.as_str()))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                )
            })
        }
        (Attach::Nbd, _) => None,
    }
}

/// A restore-and-verify operation must have a check for what it restores.
pub(super) fn check_restore(
    op: &super::RawOperation,
    group: &str,
    workload: Option<&str>,
    groups: &[VolumeGroup],
    workloads: &[Workload],
) -> Result<(), SpecError> {
    let name = &op.name;
    let Some(group) = groups.iter().find(|g| g.name == group) else {
        return Ok(()); // operation_target named it already
    };
    let workload = workload.and_then(|w| workloads.iter().find(|x| x.name == w));
    if restore_check(group, workload).is_some() {
        return Ok(());
    }
    refused(name, format!(
        "control operation `{}` restores snapshots of volume group `{}`, reached over NBD, with nothing to check them by: \
         name a fio workload that writes with `verify: crc32c` and one block size (`workload: NAME`), \
         or add `attach: fs` to the group (then fsck checks them)",
        name.value, group.name
    ))
}
