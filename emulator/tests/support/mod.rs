//! Shared test support: readers of Vidur's measured profiles.

pub mod vidur;
