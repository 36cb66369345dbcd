//! Helpers shared by the examples (device discovery, argument parsing), so that no example
//! copies another's code.
