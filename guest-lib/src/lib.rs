//! vrnic guest library: user-space driver and verbs API for the vrnic device.
