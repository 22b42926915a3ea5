//! Zero writes and discards: metadata-only where whole clusters (or, with
//! extended L2 entries, whole subclusters) are covered, written zeros
//! elsewhere.

use strata_format::entry::subcluster_mask;
use strata_format::{ExtendedL2, L2Mapping};

use super::{refuse_if_corrupt, top_extended, top_mapping, Writer};
use crate::chain::Chain;
use crate::error::Result;

impl Writer {
    /// Makes `len` bytes at `offset` of an extended L2 top layer read as
    /// zeros: whole subclusters get their zero bit (metadata only), the
    /// rest is written with zeros.
    fn write_zeroes_ext(&mut self, chain: &Chain, offset: u64, len: u64) -> Result<()> {
        let top = chain.top();
        let cb = top.cluster_bits().unwrap_or(16);
        let sb = top.subcluster_bits();
        let ss = 1u64 << sb;
        let end = offset + len;
        let mut pos = offset;
        while pos < end {
            let cluster = pos >> cb;
            let c_start = cluster << cb;
            let seg_end = end.min(c_start + (1 << cb));
            // Whole subclusters of [pos, seg_end); a last subcluster cut
            // short by the end of the disk counts as whole.
            let first = (pos - c_start).div_ceil(ss);
            let last_excl = if seg_end == chain.size {
                (seg_end - c_start).div_ceil(ss)
            } else {
                (seg_end - c_start) / ss
            };
            let (head_end, tail_start) = if first < last_excl {
                (
                    c_start + first * ss,
                    (c_start + last_excl * ss).min(seg_end),
                )
            } else {
                (seg_end, seg_end)
            };
            if head_end > pos {
                self.write(chain, &vec![0u8; (head_end - pos) as usize], pos)?;
            }
            if first < last_excl {
                let mask = subcluster_mask(first as u32, last_excl as u32 - 1);
                self.zero_subclusters(chain, cluster, mask)?;
            }
            if seg_end > tail_start {
                self.write(
                    chain,
                    &vec![0u8; (seg_end - tail_start) as usize],
                    tail_start,
                )?;
            }
            pos = seg_end;
        }
        Ok(())
    }

    /// Sets the zero bit of subclusters `mask` of guest `cluster`. The host
    /// cluster is released when no subcluster is left allocated, unless a
    /// write to the cluster is in flight (it will publish into it).
    fn zero_subclusters(&mut self, chain: &Chain, cluster: u64, mask: u32) -> Result<()> {
        let top = chain.top();
        let cur = top_extended(top, cluster)?;
        self.check_replace(chain, cluster, &cur.cluster)?;
        if let L2Mapping::Compressed { .. } = cur.cluster {
            if mask != u32::MAX {
                // A compressed cluster has no subclusters: rewrite it.
                let cb = top.cluster_bits().unwrap_or(16);
                let sb = top.subcluster_bits();
                let lo = u64::from(mask.trailing_zeros());
                let hi = u64::from(32 - mask.leading_zeros());
                let start = (cluster << cb) + (lo << sb);
                let stop = ((cluster << cb) + (hi << sb)).min(chain.size);
                return self.write(chain, &vec![0u8; (stop - start) as usize], start);
            }
            self.set_l2_ext(chain, cluster, ExtendedL2::encode(0, 0, u32::MAX), mask)?;
            return self.release(chain, cluster, cur.cluster, 0);
        }
        if cur.alloc & mask == 0 && cur.zero & mask == mask {
            return Ok(());
        }
        let alloc = cur.alloc & !mask;
        let zero = cur.zero | mask;
        let host = cur.host().map_or(0, |h| h.0);
        let free = alloc == 0 && host != 0 && !self.in_flight.contains(&cluster);
        let keep = if free { 0 } else { host };
        self.set_l2_ext(chain, cluster, ExtendedL2::encode(keep, alloc, zero), mask)?;
        if free {
            self.release(chain, cluster, cur.cluster, 0)?;
        }
        Ok(())
    }

    /// Makes `len` bytes at `offset` read as zeros.
    pub(crate) fn write_zeroes(&mut self, chain: &Chain, offset: u64, len: u64) -> Result<()> {
        refuse_if_corrupt(chain)?;
        let top = chain.top();
        if top.extended_l2() {
            return self.write_zeroes_ext(chain, offset, len);
        }
        let zero_flag = top.header().is_some_and(|h| h.version >= 3);
        let cb = top.cluster_bits().unwrap_or(16);
        let cs = 1u64 << cb;
        let end = offset + len;
        let mut pos = offset;
        while pos < end {
            let cluster = pos >> cb;
            let c_start = cluster << cb;
            let seg_end = end.min(c_start + cs);
            let covers = pos == c_start && (seg_end == c_start + cs || seg_end == chain.size);
            if zero_flag && covers {
                let old = top_mapping(top, cluster)?;
                self.check_replace(chain, cluster, &old)?;
                self.set_l2(chain, cluster, L2Mapping::encode_zero())?;
                self.release(chain, cluster, old, 0)?;
            } else {
                let zeros = vec![0u8; (seg_end - pos) as usize];
                self.write(chain, &zeros, pos)?;
            }
            pos = seg_end;
        }
        Ok(())
    }

    /// Releases whole top-layer clusters in the range (see [`crate::Disk::discard`]).
    pub(crate) fn discard(&mut self, chain: &Chain, offset: u64, len: u64) -> Result<()> {
        refuse_if_corrupt(chain)?;
        let top = chain.top();
        let Some(h) = top.header() else {
            return Ok(());
        };
        let cb = h.cluster_bits;
        let cs = 1u64 << cb;
        let end = offset + len;
        let first = offset.div_ceil(cs);
        // A partial last cluster at the end of the disk counts as whole.
        let last = if end == chain.size {
            end.div_ceil(cs)
        } else {
            end / cs
        };
        let has_backing = chain.depth() > 1;
        if has_backing && h.version < 3 {
            return Ok(());
        }
        if top.extended_l2() {
            for cluster in first..last {
                // Advisory: leave a cluster being written alone.
                if self.in_flight.contains(&cluster) {
                    continue;
                }
                let cur = top_extended(top, cluster)?;
                self.check_replace(chain, cluster, &cur.cluster)?;
                let zero = if has_backing { u32::MAX } else { 0 };
                if cur.cluster.is_unallocated() && cur.alloc == 0 && cur.zero == zero {
                    continue;
                }
                // Subclusters whose state changes (all of a compressed one).
                let changed = if matches!(cur.cluster, L2Mapping::Compressed { .. }) {
                    u32::MAX
                } else {
                    (cur.alloc | cur.zero) ^ zero | cur.alloc
                };
                self.set_l2_ext(chain, cluster, ExtendedL2::encode(0, 0, zero), changed)?;
                self.release(chain, cluster, cur.cluster, 0)?;
            }
            return Ok(());
        }
        for cluster in first..last {
            let old = top_mapping(top, cluster)?;
            self.check_replace(chain, cluster, &old)?;
            let entry = if has_backing {
                L2Mapping::encode_zero()
            } else {
                0
            };
            if old.is_unallocated() && !has_backing {
                continue;
            }
            self.set_l2(chain, cluster, entry)?;
            self.release(chain, cluster, old, 0)?;
        }
        Ok(())
    }
}
