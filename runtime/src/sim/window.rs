//! The simulator's table of sessions in flight: a window over session indices, from the oldest
//! session still open to the newest arrival. Sessions arrive in index order (the trace is sorted
//! by time and a session's index is its place in it), so a slot is created at the back when a
//! session arrives and the front is dropped as soon as its session has ended: the table grows
//! with the sessions in flight (and those that arrived while the oldest of them ran), not with
//! the run.
//!
//! Generic over what a slot holds; no simulator types. Must not depend on anything else here.

use std::collections::VecDeque;

/// Slots for session indices `base..base + slots.len()`; `None` for an ended session (or one
/// that failed to start).
#[derive(Debug)]
pub(crate) struct SessionWindow<T> {
    base: usize,
    slots: VecDeque<Option<T>>,
}

impl<T> Default for SessionWindow<T> {
    fn default() -> Self {
        SessionWindow { base: 0, slots: VecDeque::new() }
    }
}

impl<T> SessionWindow<T> {
    /// Open slot `i` with `value`. Indices arrive in increasing order: an index below the
    /// window's end is refused (returned), which a caller reports as an internal error.
    pub(crate) fn open(&mut self, i: usize, value: T) -> Result<(), T> {
        if i < self.base + self.slots.len() {
            return Err(value);
        }
        if self.slots.is_empty() {
            self.base = i;
        }
        while self.base + self.slots.len() < i {
            self.slots.push_back(None);
        }
        self.slots.push_back(Some(value));
        Ok(())
    }

    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        self.slots.get(i.checked_sub(self.base)?)?.as_ref()
    }

    pub(crate) fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        self.slots.get_mut(i.checked_sub(self.base)?)?.as_mut()
    }

    /// Take slot `i` out (its session ended) and drop the ended slots at the front.
    pub(crate) fn close(&mut self, i: usize) -> Option<T> {
        let value = self.slots.get_mut(i.checked_sub(self.base)?)?.take();
        while matches!(self.slots.front(), Some(None)) {
            self.slots.pop_front();
            self.base += 1;
        }
        value
    }

    /// The open slots, in index order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (usize, &T)> {
        self.slots.iter().enumerate().filter_map(|(k, v)| Some((self.base + k, v.as_ref()?)))
    }

    /// Slots held (open or ended but not yet dropped): the window's length.
    #[cfg(test)]
    pub(crate) fn span(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_spans_the_oldest_open_session_to_the_newest() {
        let mut w = SessionWindow::default();
        for i in 0..4 {
            w.open(i, i * 10).unwrap();
        }
        assert_eq!(w.close(1), Some(10));
        assert_eq!(w.span(), 4, "slot 0 is still open: nothing dropped");
        assert_eq!(w.get(1), None);
        assert_eq!(w.close(0), Some(0));
        assert_eq!(w.span(), 2, "0 and 1 dropped");
        assert_eq!((w.get(2), w.get(3)), (Some(&20), Some(&30)));
        // An index that failed to start leaves a hole; a later one opens past it.
        w.open(5, 50).unwrap();
        assert_eq!(w.iter().map(|(i, v)| (i, *v)).collect::<Vec<_>>(), vec![(2, 20), (3, 30), (5, 50)]);
        assert_eq!(w.open(4, 40), Err(40), "indices arrive in order");
        for i in [3, 5, 2] {
            w.close(i);
        }
        assert_eq!(w.span(), 0);
        assert_eq!(w.get(2), None);
        assert_eq!(w.close(7), None);
        // An empty window restarts at the next index.
        w.open(9, 90).unwrap();
        assert_eq!((w.span(), w.get(9)), (1, Some(&90)));
        *w.get_mut(9).unwrap() += 1;
        assert_eq!(w.get(9), Some(&91));
    }
}
