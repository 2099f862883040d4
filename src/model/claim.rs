//! Who a volume is for: the claim keys external-provisioner passes with
//! `--extra-create-metadata`, carried into the volume context and backend records.

use std::collections::HashMap;

/// Parameters external-provisioner adds with `--extra-create-metadata`.
pub const PARAM_PVC_NAME: &str = "csi.storage.k8s.io/pvc/name";
pub const PARAM_PVC_NAMESPACE: &str = "csi.storage.k8s.io/pvc/namespace";
pub const PARAM_PV_NAME: &str = "csi.storage.k8s.io/pv/name";

/// Who the volume is for, from external-provisioner's `--extra-create-metadata`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimRef {
    pub pvc_name: Option<String>,
    pub pvc_namespace: Option<String>,
    pub pv_name: Option<String>,
}

impl ClaimRef {
    /// The same keys go back into the volume context so node calls know the claim.
    pub fn to_context(&self) -> HashMap<String, String> {
        [
            (PARAM_PVC_NAME, &self.pvc_name),
            (PARAM_PVC_NAMESPACE, &self.pvc_namespace),
            (PARAM_PV_NAME, &self.pv_name),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.clone().map(|v| (k.to_string(), v)))
        .collect()
    }

    pub fn from_context(map: &HashMap<String, String>) -> Self {
        let get = |k: &str| map.get(k).filter(|v| !v.is_empty()).cloned();
        Self {
            pvc_name: get(PARAM_PVC_NAME),
            pvc_namespace: get(PARAM_PVC_NAMESPACE),
            pv_name: get(PARAM_PV_NAME),
        }
    }
}
