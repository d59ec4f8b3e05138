//! switchyard-emulator (being written)
