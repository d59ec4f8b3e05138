//! switchyard-tools (being written)
