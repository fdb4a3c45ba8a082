//! The counters of the vhost-user side of the device ([`BackendStats`]):
//! kept by the data path, published and served by module `stats`.

vrnic::counters! {
    /// Counters of the vhost-user side of the device (the engine's own are
    /// [`vrnic::device::DeviceStats`]). All counts since the backend was made.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct BackendStats {
        /// Control commands executed by the device.
        commands,
        /// Control chains completed with 0 bytes used and not executed: no or
        /// too small (< 8 bytes) writable part, writable part outside guest
        /// memory, or readable and writable descriptors interleaved.
        rejected_chains,
        /// Control commands whose readable part lay outside guest memory,
        /// answered with `STATUS_EFAULT` and not executed.
        faulted_commands,
        /// Doorbells handed to the device.
        doorbells,
        /// Doorbell chains ignored: fewer than 16 readable bytes, or outside
        /// guest memory.
        bad_doorbells,
        /// Events written to event-queue buffers.
        events_delivered,
        /// Events dropped because `datapath::MAX_PENDING_EVENTS` were already waiting.
        events_dropped,
        /// Event-queue buffers completed unused: smaller than 16 writable bytes
        /// or outside guest memory.
        bad_event_buffers,
        /// Frames the link refused with an error, or stayed too full to take
        /// for `vrnic::link::txq::TX_HOLD_MAX_NS`.
        link_tx_errors,
        /// Errors receiving from the link.
        link_rx_errors,
        /// Device resets (vhost-user `RESET_DEVICE`, a control queue restarted
        /// at another index than where it stopped, a memory table set while
        /// stopped, or the end of a frontend connection).
        device_resets,
        /// Panics caught in the engine (each followed by a device reset).
        engine_panics,
        /// Times the frontend stopped the control queue of a device in use
        /// (`GET_VRING_BASE`: a VM pause, or a guest resetting the device).
        device_stops,
        /// Stops followed by a restart where the control queue left off (a VM
        /// pause and `cont`): the device carried on with its state.
        device_resumes,
        /// Frames from the link dropped while the device was stopped.
        rx_dropped_stopped,
        /// Times the device found its queues started at indices it never
        /// served: a driver set up against an earlier backend (a daemon that
        /// restarted under a running guest). Each time the device is lost
        /// until the driver resets it (`DataPath::check_driver`).
        device_lost,
        /// Commands refused (`STATUS_ENODEV`) and doorbells ignored while the
        /// device was lost.
        lost_requests,
        /// Polling sessions the worker ran after work ((module `spin`)).
        poll_sessions,
        /// Sessions ended by a neighbour that does not yield the core, each
        /// followed by a pause without polling (`spin::PollConfig`).
        poll_backoffs,
        /// Times another function's worker, the daemon's poller, took over
        /// polling this device ((module `poll_group`)).
        poll_adopted,
        /// Time the worker polled without finding work, nanoseconds: the CPU
        /// time adaptive polling costs beyond the work itself (time yielded to
        /// other threads included).
        poll_idle_ns,
        /// Times the worker, about to sleep, found chains the driver had made
        /// available without a kick and served them (`DataPath::serve_late`):
        /// how often the safety net catches a missing notification.
        late_chains,
        /// Frontends refused while another was served: a function serves one
        /// program at a time (module `server`).
        frontends_refused,
        /// Times the frontend's memory lost its backing under the daemon (a
        /// `SIGBUS` caught on a guest-memory access, [`crate::fault`]: a file
        /// shrunk after `SET_MEM_TABLE`, a hugetlb pool run dry): each time
        /// the device was reset, the memory table dropped and the connection
        /// closed (`DataPath::memory_fault`).
        memory_faults,
        /// Memory tables refused (`SET_MEM_TABLE` failed, the connection
        /// closed): a region running past the end of its file, or a region
        /// whose file could not be checked ([`crate::memory::check_table`]).
        memory_tables_refused,
    }
}
