//! Per-volume locks. An operation on a volume holds its [`VolumeGuard`]; a second
//! operation on the same volume gets [`LockError::Busy`] (gRPC ABORTED, so the CO
//! retries) instead of waiting. Different volumes never wait on each other.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use crate::model::{Terminal, Token};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockError {
    #[error("volume {volume} is busy with another operation ({operation} waits for it); retry later")]
    Busy { volume: String, operation: &'static str },
}

impl Terminal for LockError {
    /// The other operation ends, and the volume with it.
    fn is_terminal(&self) -> bool {
        match self {
            LockError::Busy { .. } => false,
        }
    }
}

#[derive(Debug, Default, Clone)]
pub struct VolumeLocks {
    held: Arc<Mutex<HashSet<Token>>>,
}

/// Proof that the holder has the volume to itself; dropping it releases the volume.
#[derive(Debug)]
pub struct VolumeGuard {
    token: Token,
    held: Arc<Mutex<HashSet<Token>>>,
}

impl VolumeGuard {
    pub fn token(&self) -> &Token {
        &self.token
    }
}

impl VolumeLocks {
    /// Locks by token rather than full id: a CreateVolume (which knows only the name) and
    /// a node call on the same volume must exclude each other.
    pub fn try_lock(&self, token: &Token, operation: &'static str) -> Result<VolumeGuard, LockError> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if !held.insert(token.clone()) {
            return Err(LockError::Busy {
                volume: token.to_string(),
                operation,
            });
        }
        Ok(VolumeGuard {
            token: token.clone(),
            held: Arc::clone(&self.held),
        })
    }

    pub fn held_count(&self) -> usize {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl Drop for VolumeGuard {
    fn drop(&mut self) {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_volume_is_busy_until_released() {
        let locks = VolumeLocks::default();
        let a = Token::for_name("a");
        let guard = locks.try_lock(&a, "stage").unwrap();
        assert!(matches!(
            locks.try_lock(&a, "publish"),
            Err(LockError::Busy { .. })
        ));
        drop(guard);
        assert!(locks.try_lock(&a, "publish").is_ok());
        assert_eq!(locks.held_count(), 0);
    }

    #[test]
    fn different_volumes_do_not_contend() {
        let locks = VolumeLocks::default();
        let _a = locks.try_lock(&Token::for_name("a"), "stage").unwrap();
        let _b = locks.try_lock(&Token::for_name("b"), "stage").unwrap();
        assert_eq!(locks.held_count(), 2);
    }
}
