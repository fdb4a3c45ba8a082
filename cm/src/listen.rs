//! Listening on service IDs.

use crate::{error::CmError, limits::MAX_LISTENERS, Cm};

impl Cm {
    /// Listens on `service_id` (cm.c `ib_cm_listen`, exact match).
    pub fn listen(&mut self, service_id: u64) -> Result<(), CmError> {
        if self.listeners.contains(&service_id) {
            return Err(CmError::Busy);
        }
        if self.listeners.len() >= MAX_LISTENERS {
            return Err(CmError::TableFull);
        }
        self.listeners.insert(service_id);
        Ok(())
    }

    /// Stops listening on `service_id`; connections it created stay.
    pub fn unlisten(&mut self, service_id: u64) -> Result<(), CmError> {
        if self.listeners.remove(&service_id) {
            Ok(())
        } else {
            Err(CmError::NotListening)
        }
    }
}
