//! The peer side of a mirror: accepting and dialing links, which links
//! hold a chunk, and the [`PeerHandler`] that answers what peers send.

use super::*;

impl Inner {
    pub(super) fn accept_loop(self: Arc<Self>, listener: TcpListener) {
        let _ = listener.set_nonblocking(true);
        while !self.stopping() {
            match listener.accept() {
                Ok((stream, _)) => {
                    let _ = stream.set_nonblocking(false);
                    let me = self.clone();
                    // The handshake may stall: never in the accept loop.
                    let _ = spawn("mirror-hello", move || me.link_up(stream, None));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    pub(super) fn link_up(self: Arc<Self>, stream: TcpStream, dialed: Option<String>) {
        let Some(me) = &self.identity else { return };
        let handler: Arc<dyn PeerHandler> = self.clone();
        match peer::start(
            stream,
            me,
            handler,
            self.upload.clone(),
            self.queued_replies.clone(),
        ) {
            Ok(link) => {
                // Lock order: table, then peers (as in `land`).
                let t = self.table.lock();
                let mut p = self.peers.lock();
                if self.stopping() {
                    link.close();
                    return;
                }
                // A peer that broke the protocol at once may have closed the
                // link already, and `on_close` (which takes the peers lock)
                // found nothing to remove: registering it now would leave a
                // dead link counted forever.
                if link.is_closed() {
                    return;
                }
                let held: Vec<u32> = p
                    .acquired
                    .iter()
                    .copied()
                    .filter(|c| t.state(*c).holds_image_data())
                    .collect();
                drop(t);
                tracing::info!("linked to peer {}", link.remote);
                link.advertise(&held);
                if let Some(addr) = dialed {
                    p.dialed.push((addr, link.clone()));
                }
                p.links.push(link);
            }
            Err(e) => tracing::info!("{e}"),
        }
    }

    pub(super) fn dial_loop(self: Arc<Self>) {
        let Some(me) = self.identity.as_ref().map(|i| i.listen.clone()) else {
            return;
        };
        let mut rng = Rng::from_os();
        let mut rendezvous_done = false;
        let mut candidates = self.config.peers.clone();
        while !self.stopping() {
            if self.config.rendezvous && !rendezvous_done {
                match self.repo.rendezvous(&me) {
                    Ok(list) => {
                        for a in list {
                            if !candidates.contains(&a) {
                                candidates.push(a);
                            }
                        }
                    }
                    Err(e) => tracing::warn!("rendezvous failed: {e}"),
                }
                rendezvous_done = true;
            } else if self.config.rendezvous {
                // Later rounds only read the list (registering once is enough).
                if let Ok(list) = self.repo.rendezvous(&me) {
                    for a in list {
                        if !candidates.contains(&a) {
                            candidates.push(a);
                        }
                    }
                }
            }
            let (have, linked) = {
                let p = self.peers.lock();
                let mut have: Vec<String> = p.links.iter().map(|l| l.remote.clone()).collect();
                have.extend(p.dialed.iter().map(|(a, _)| a.clone()));
                (have, p.links.len())
            };
            let want = self.config.fanout.saturating_sub(linked);
            for addr in topology::sample(&candidates, &me, &have, want, &mut rng) {
                let Ok(sock) = addr.parse() else {
                    tracing::warn!("peer address '{addr}' is not IP:PORT; ignored");
                    continue;
                };
                if let Ok(stream) = TcpStream::connect_timeout(&sock, Duration::from_secs(1)) {
                    self.clone().link_up(stream, Some(addr));
                }
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// The least-loaded usable links that advertised `c`, best first.
    pub(super) fn holders(&self, c: u32) -> Vec<Arc<Link>> {
        let mut l: Vec<(usize, Arc<Link>)> = self
            .peers
            .lock()
            .links
            .iter()
            .filter(|l| l.usable() && l.holds(c))
            .map(|l| (l.load(), l.clone()))
            .collect();
        l.sort_by_key(|(load, _)| *load);
        l.into_iter().map(|(_, l)| l).take(2).collect()
    }
}

impl PeerHandler for Inner {
    fn on_coming(&self, _link: &Arc<Link>, _chunks: &[u32]) {
        // Wakes fetches deferring to the announcing peer.
        let _t = self.table.lock();
        self.changed.notify_all();
    }

    fn on_have(&self, _link: &Arc<Link>, chunks: &[u32]) {
        let mut t = self.table.lock();
        for c in chunks {
            t.on_advert(*c);
        }
        drop(t);
        self.changed.notify_all();
    }

    fn serve(&self, c: u32) -> Option<Vec<u8>> {
        let held = self.table.lock().state(c).holds_image_data();
        let (off, len) = self.manifest.extent(c);
        let mut data = vec![0u8; len];
        // Checked again after reading: a write may have landed meanwhile,
        // and written data is never served.
        let ok = held
            && self.store.image.read_exact_at(&mut data, off).is_ok()
            && self.table.lock().state(c).holds_image_data();
        if ok {
            bump(&self.counters.served);
            Some(data)
        } else {
            bump(&self.counters.refused);
            None
        }
    }

    fn on_close(&self, link: &Arc<Link>, malformed: bool) {
        if malformed {
            bump(&self.counters.malformed_links);
        }
        tracing::info!("link to peer {} closed", link.remote);
        let mut p = self.peers.lock();
        p.links.retain(|l| !Arc::ptr_eq(l, link));
        p.dialed.retain(|(_, l)| !Arc::ptr_eq(l, link));
    }
}
