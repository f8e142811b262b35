//! tiercache engine: the decisions and metadata of an SSD cache in front of a slower backing
//! device. It does no I/O, reads no clock and starts no thread: for each request it updates
//! its state and returns a [`Plan`] of device steps that the simulator or the live server
//! executes.

pub mod request;

pub use request::{Op, Request, MAX_CLASS, NUM_CLASSES};
