//! `localvol.v1.VolumeStates` on the CSI socket: the daemon's in-memory
//! [`crate::volume_states::VolumeStates`] for `localvol status`, under the same name as
//! the service it answers. Read-only, no lock, no backend call.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tonic::{Request, Response, Status};

use super::Driver;
use crate::proto::localvol::v1 as pb;
use crate::proto::localvol::v1::volume_states_server::VolumeStates as Service;
use crate::volume_states::{LastReclaim, LastResize, ObjectName, ReclaimResult, ResizeState, VolumeState};

#[derive(Debug)]
pub struct StatesService(pub Arc<Driver>);

fn unix_seconds(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

fn object(o: &ObjectName) -> pb::ObjectName {
    pb::ObjectName {
        namespace: o.namespace.clone(),
        name: o.name.clone(),
    }
}

fn reclaim(r: &LastReclaim) -> pb::Reclaim {
    use pb::reclaim::Result as R;
    let mut out = pb::Reclaim {
        finished_unix_seconds: unix_seconds(r.finished),
        ..Default::default()
    };
    match &r.result {
        ReclaimResult::Trimmed {
            reclaimed_bytes,
            trimmed_bytes,
        } => {
            out.set_result(R::Trimmed);
            out.reclaimed_bytes = *reclaimed_bytes;
            out.trimmed_bytes = *trimmed_bytes;
        }
        ReclaimResult::NotDiscarded => out.set_result(R::NotDiscarded),
        ReclaimResult::Failed { error } => {
            out.set_result(R::Failed);
            out.error = error.clone();
        }
    }
    out
}

fn resize(r: &LastResize) -> pb::Resize {
    use pb::resize::State as S;
    let mut out = pb::Resize {
        updated_unix_seconds: unix_seconds(r.updated),
        step: r.step.as_str().to_string(),
        ..Default::default()
    };
    let (state, size) = match &r.state {
        ResizeState::InProgress { target_bytes } => (S::InProgress, *target_bytes),
        ResizeState::NodeExpansionPending { size_bytes } => (S::NodeExpansionPending, *size_bytes),
        ResizeState::Done { size_bytes } => (S::Done, *size_bytes),
        ResizeState::Failed { target_bytes, reason } => {
            out.reason = reason.clone();
            (S::Failed, *target_bytes)
        }
    };
    out.set_state(state);
    out.size_bytes = size;
    out
}

/// One registry entry on the wire.
pub fn volume_state(id: String, state: &VolumeState) -> pb::VolumeState {
    pb::VolumeState {
        volume_id: id,
        pvc: state.claim.as_ref().map(object),
        publications: state
            .publications
            .iter()
            .map(|(target, pod)| pb::Publication {
                target_path: target.display().to_string(),
                pod: pod.as_ref().map(object),
            })
            .collect(),
        last_reclaim: state.last_reclaim.as_ref().map(reclaim),
        resize: state.resize.as_ref().map(resize),
    }
}

#[tonic::async_trait]
impl Service for StatesService {
    async fn list_volume_states(
        &self,
        _: Request<pb::ListVolumeStatesRequest>,
    ) -> Result<Response<pb::ListVolumeStatesResponse>, Status> {
        let states = &self.0.volume_states;
        Ok(Response::new(pb::ListVolumeStatesResponse {
            volumes: states
                .snapshot()
                .iter()
                .map(|(id, state)| volume_state(id.to_string(), state))
                .collect(),
            since_unix_seconds: unix_seconds(states.started()),
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::model::{ClassName, Token, VolumeId};
    use crate::volume_states::{ResizeStep, VolumeStates};

    #[test]
    fn registry_entries_go_on_the_wire_unchanged() {
        let states = VolumeStates::new();
        let id = VolumeId::new(ClassName::parse("fast").unwrap(), Token::for_name("pvc-1"));
        let web = ObjectName {
            namespace: "apps".into(),
            name: "web-0".into(),
        };
        states.published(&id, Path::new("/t"), None, Some(web));
        states.reclaimed(&id, ReclaimResult::Failed { error: "EIO".into() });
        states.resized(
            &id,
            ResizeStep::Controller,
            ResizeState::NodeExpansionPending { size_bytes: 42 },
        );
        let (_, state) = &states.snapshot()[0];
        let wire = volume_state(id.to_string(), state);
        assert_eq!(wire.volume_id, "fast.pvc-1");
        assert_eq!(wire.pvc, None);
        assert_eq!(wire.publications[0].target_path, "/t");
        assert_eq!(wire.publications[0].pod.as_ref().unwrap().name, "web-0");
        let reclaim = wire.last_reclaim.unwrap();
        assert_eq!(reclaim.result(), pb::reclaim::Result::Failed);
        assert_eq!(reclaim.error, "EIO");
        assert!(reclaim.finished_unix_seconds >= unix_seconds(states.started()));
        let resize = wire.resize.unwrap();
        assert_eq!(resize.state(), pb::resize::State::NodeExpansionPending);
        assert_eq!((resize.step.as_str(), resize.size_bytes), ("controller", 42));
    }
}
