//! Ranged reads of an erasure-coded object: only the stripes covering
//! the range are read, and from each data fragment only the bytes of
//! them the range needs, each checked against the fragment's chunk
//! table. The fragments are asked at once (they lie on distinct nodes).
//! When a data fragment cannot be read, the covering stripes are read
//! from any k fragments (parity too) and decoded.

use super::get::Opened;
use super::replica::Replica;
use super::Client;
use crate::erasure::StripeCoder;
use crate::range_body::{Asked, RangeAnswer};
use crate::transport::REPLY_STALL;
use std::ops::Range;
use strata_store_protocol::addr::Addr;
use strata_store_protocol::class::StripeLayout;
use strata_store_protocol::wire::Fragments;
use strata_store_protocol::Error;
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// Bytes of an erasure-coded object's range read at once: the pieces of
/// the fragments covering it are held in memory to be put in order (at
/// most (k + m) / k times this when a data fragment is missing).
pub(super) const EC_PIECE: u64 = 8 << 20;

/// The bytes of data fragment `j` (fragment offsets) that hold the
/// object bytes of `piece`, if it holds any.
fn fragment_span(layout: &StripeLayout, j: usize, piece: &Range<u64>) -> Option<Range<u64>> {
    let mut span: Option<Range<u64>> = None;
    for (at, within) in shard_pieces(layout, j, piece) {
        let fragment = at + within.start..at + within.end;
        span = Some(match span {
            None => fragment,
            Some(s) => s.start..fragment.end,
        });
    }
    span
}

/// For each stripe covering `piece`, where data fragment `j`'s shard of
/// it starts in the fragment, and the bytes of that shard (offsets in
/// the shard) that hold bytes of `piece`: in the object's order.
fn shard_pieces(layout: &StripeLayout, j: usize, piece: &Range<u64>) -> Vec<(u64, Range<u64>)> {
    let shard = layout.shard as u64;
    let stripe = layout.stripe_data() as u64;
    let mut pieces = Vec::new();
    for s in piece.start / stripe..=(piece.end - 1) / stripe {
        let object = s * stripe + j as u64 * shard;
        let (from, to) = (piece.start.max(object), piece.end.min(object + shard));
        if from < to {
            pieces.push((s * shard, from - object..to - object));
        }
    }
    pieces
}

/// How fetching a fragment's bytes ended.
enum Fetched {
    Bytes(Vec<u8>),
    NoTable,
    Failed(Error),
}

impl Client {
    /// Reads `piece` (at most [`EC_PIECE`] bytes) of an erasure-coded
    /// object into `out`: from the data fragments alone when each one
    /// needed answers, else decoded from any k fragments. Nothing is
    /// written before every byte of the piece is checked, so the bytes
    /// handed on are the whole piece or none.
    pub(super) async fn fragments_range<W: AsyncWrite + Unpin>(
        &self,
        opened: &Opened,
        fragments: &Fragments,
        piece: Range<u64>,
        out: &mut W,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<(RangeAnswer, u64), Error> {
        let record = &opened.record;
        let layout = StripeLayout::new(record.size, fragments.data, fragments.parity());
        let mut damaged: Vec<Addr> = Vec::new();
        let mut failed: Vec<usize> = Vec::new();
        let mut data: Vec<Option<(u64, Vec<u8>)>> = vec![None; layout.data];
        // Every data fragment's span at once: they lie on distinct nodes,
        // so the range takes the slowest fragment's time, not their sum.
        let spans: Vec<(usize, Range<u64>)> = (0..layout.data)
            .filter_map(|j| Some((j, fragment_span(&layout, j, &piece)?)))
            .collect();
        let fetches = spans
            .iter()
            .map(|(j, span)| self.fetch(opened, &layout, *j, span.clone()));
        let fetched = futures::future::join_all(fetches).await;
        for ((j, span), fetched) in spans.into_iter().zip(fetched) {
            match fetched {
                Fetched::Bytes(bytes) => data[j] = Some((span.start, bytes)),
                Fetched::NoTable => return Ok((RangeAnswer::NoTable, 0)),
                Fetched::Failed(e) => {
                    if matches!(e, Error::Corrupt(_)) {
                        damaged.push(record.replicas[j]);
                    }
                    failed.push(j);
                }
            }
        }
        let io = |e| Error::io("writing the output", e);
        if failed.is_empty() {
            let stripe = layout.stripe_data() as u64;
            let pieces: Vec<_> = (0..layout.data)
                .map(|j| shard_pieces(&layout, j, &piece))
                .collect();
            for s in piece.start / stripe..=(piece.end - 1) / stripe {
                let at_stripe = s * layout.shard as u64;
                for (slot, pieces) in data.iter().zip(&pieces) {
                    let Some((first, bytes)) = slot else { continue };
                    for (at, within) in pieces.iter().filter(|(at, _)| *at == at_stripe) {
                        let from = (at + within.start - first) as usize;
                        let to = (at + within.end - first) as usize;
                        out.write_all(&bytes[from..to]).await.map_err(io)?;
                    }
                }
            }
        } else {
            let answer = self.decode_range(opened, &layout, &piece, &failed, &mut damaged, out);
            if answer.await? == RangeAnswer::NoTable {
                return Ok((RangeAnswer::NoTable, 0));
            }
        }
        for bad in damaged {
            self.report_bad_replica(&record.name, bad);
        }
        let length = piece.end - piece.start;
        progress(length);
        Ok((RangeAnswer::Served, length))
    }

    /// Reads the stripes covering `piece` from any k fragments but those
    /// `failed`, decodes them and writes the bytes of `piece`.
    async fn decode_range<W: AsyncWrite + Unpin>(
        &self,
        opened: &Opened,
        layout: &StripeLayout,
        piece: &Range<u64>,
        failed: &[usize],
        damaged: &mut Vec<Addr>,
        out: &mut W,
    ) -> Result<RangeAnswer, Error> {
        let record = &opened.record;
        let (shard, stripe) = (layout.shard as u64, layout.stripe_data() as u64);
        let stripes = piece.start / stripe..(piece.end - 1) / stripe + 1;
        let span = stripes.start * shard..stripes.end * shard;
        let mut got: Vec<(usize, Vec<u8>)> = Vec::new();
        let mut reasons = Vec::new();
        let mut candidates = (0..layout.data + layout.parity).filter(|i| !failed.contains(i));
        // As many fragments at once as are still missing, until k came or
        // none is left to try.
        while got.len() < layout.data {
            let round: Vec<usize> = candidates.by_ref().take(layout.data - got.len()).collect();
            if round.is_empty() {
                break;
            }
            let fetches = round
                .iter()
                .map(|&index| self.fetch(opened, layout, index, span.clone()));
            let fetched = futures::future::join_all(fetches).await;
            for (index, fetched) in round.into_iter().zip(fetched) {
                match fetched {
                    Fetched::Bytes(bytes) => got.push((index, bytes)),
                    Fetched::NoTable => return Ok(RangeAnswer::NoTable),
                    Fetched::Failed(e) => {
                        if matches!(e, Error::Corrupt(_)) {
                            damaged.push(record.replicas[index]);
                        }
                        reasons.push(format!("fragment {index}: {}", e.report()));
                    }
                }
            }
        }
        if got.len() < layout.data {
            return Err(Error::Corrupt(format!(
                "{:?}: fewer than {} of its {} fragments could be read for a range ({})",
                record.name,
                layout.data,
                layout.data + layout.parity,
                reasons.join("; ")
            )));
        }
        let mut coder = StripeCoder::new(*layout)?;
        let io = |e| Error::io("writing the output", e);
        for (n, s) in stripes.enumerate() {
            let at = n * layout.shard;
            let shards = got
                .iter()
                .map(|(index, bytes)| (*index, bytes[at..at + layout.shard].to_vec()))
                .collect();
            let decoded = coder.decode(shards)?;
            for (j, bytes) in decoded.iter().enumerate() {
                let object = s * stripe + j as u64 * shard;
                let (from, to) = (piece.start.max(object), piece.end.min(object + shard));
                if from < to {
                    let kept = &bytes[(from - object) as usize..(to - object) as usize];
                    out.write_all(kept).await.map_err(io)?;
                }
            }
        }
        Ok(RangeAnswer::Served)
    }

    /// The bytes `span` of fragment `index`, checked against its chunk
    /// table.
    async fn fetch(
        &self,
        opened: &Opened,
        layout: &StripeLayout,
        index: usize,
        span: Range<u64>,
    ) -> Fetched {
        let Some(&addr) = opened.record.replicas.get(index) else {
            return Fetched::Failed(Error::Corrupt(format!(
                "{:?} names no fragment {index}",
                opened.record.name
            )));
        };
        let replica = match Replica::locate(&self.table(), addr) {
            Ok(replica) => replica,
            Err(e) => return Fetched::Failed(e),
        };
        let asked = |handed: u64| Asked {
            replica: addr,
            size: layout.fragment_len(),
            offset: span.start + handed,
            length: span.end - span.start - handed,
        };
        // Bounded: a piece's span of one fragment is at most EC_PIECE
        // bytes and a few shards.
        let mut bytes = Vec::with_capacity((span.end - span.start) as usize);
        let mut handed = 0;
        let how = (opened.ticket.as_slice(), REPLY_STALL);
        match self
            .range_from(&replica, how, asked, &mut bytes, &mut handed, &|_| {})
            .await
        {
            Ok(RangeAnswer::Served) => Fetched::Bytes(bytes),
            Ok(RangeAnswer::NoTable) => Fetched::NoTable,
            Err(e) => Fetched::Failed(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The data fragments' spans, laid out stripe by stripe in the
        /// object's order, give back exactly the bytes of the piece.
        #[test]
        fn fragment_spans_hold_the_piece_in_order(
            size in 1u64..3_000_000,
            k in 1u8..6,
            a in 0u64..3_000_000,
            b in 0u64..3_000_000,
        ) {
            let layout = StripeLayout::new(size, k, 2);
            let (x, y) = (a % size, b % size);
            let piece = x.min(y)..x.max(y) + 1;
            let (shard, stripe) = (layout.shard as u64, layout.stripe_data() as u64);
            // Object byte o is in fragment j at offset f.
            let locate = |o: u64| {
                let s = o / stripe;
                let j = (o % stripe) / shard;
                (j as usize, s * shard + o % shard)
            };
            let step = ((piece.end - piece.start) / 97).max(1) as usize;
            for o in (piece.start..piece.end).step_by(step) {
                let (j, f) = locate(o);
                let span = fragment_span(&layout, j, &piece).expect("a span for a fragment holding bytes");
                prop_assert!(span.contains(&f));
                prop_assert!(span.end <= layout.fragment_len());
            }
            // Every span's bytes are all needed: their sizes add up to the piece.
            let total: u64 = (0..layout.data)
                .filter_map(|j| fragment_span(&layout, j, &piece))
                .map(|s| s.end - s.start)
                .sum();
            let pieces: u64 = (0..layout.data)
                .flat_map(|j| shard_pieces(&layout, j, &piece))
                .map(|(_, w)| w.end - w.start)
                .sum();
            prop_assert_eq!(pieces, piece.end - piece.start);
            prop_assert_eq!(total, piece.end - piece.start);
        }
    }
}
