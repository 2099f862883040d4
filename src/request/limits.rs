//! The CSI spec's size limits and the volume context keys localvol understands.
//!
//! CSI bounds strings (names, ids) at 128 bytes and each map at 4 KiB, and asks that
//! names carry no control characters; anything larger or stranger is refused at the
//! edge, before it reaches a log line, a file name or a command.

use std::collections::HashMap;

use super::{PARAM_DEVICE_CLASS, invalid};
use crate::model::{PARAM_PV_NAME, PARAM_PVC_NAME, PARAM_PVC_NAMESPACE, ValidationError};

/// Longest name or id the CSI spec lets a CO send.
pub const MAX_STRING_BYTES: usize = 128;
/// Largest map (keys plus values) the CSI spec lets a CO send.
pub const MAX_MAP_BYTES: usize = 4096;

/// Keys kubelet sends with `podInfoOnMount` (and for inline volumes, which are refused).
pub const CONTEXT_POD_NAME: &str = "csi.storage.k8s.io/pod.name";
pub const CONTEXT_POD_NAMESPACE: &str = "csi.storage.k8s.io/pod.namespace";
pub const CONTEXT_POD_UID: &str = "csi.storage.k8s.io/pod.uid";
pub const CONTEXT_SERVICE_ACCOUNT: &str = "csi.storage.k8s.io/serviceAccount.name";
pub const CONTEXT_EPHEMERAL: &str = "csi.storage.k8s.io/ephemeral";
/// external-provisioner's mark on the PVs it provisioned.
pub const CONTEXT_PROVISIONER_IDENTITY: &str = "storage.kubernetes.io/csiProvisionerIdentity";

/// Every key a node call's volume context may carry: kubelet's, external-provisioner's,
/// and those localvol's CreateVolume puts there itself.
const CONTEXT_KEYS: &[&str] = &[
    CONTEXT_POD_NAME,
    CONTEXT_POD_NAMESPACE,
    CONTEXT_POD_UID,
    CONTEXT_SERVICE_ACCOUNT,
    CONTEXT_EPHEMERAL,
    CONTEXT_PROVISIONER_IDENTITY,
    PARAM_PVC_NAME,
    PARAM_PVC_NAMESPACE,
    PARAM_PV_NAME,
    PARAM_DEVICE_CLASS,
];

/// A name: at most 128 bytes, no control characters.
pub fn check_name(field: &'static str, value: &str) -> Result<(), ValidationError> {
    if value.len() > MAX_STRING_BYTES {
        return Err(invalid(
            field,
            format!(
                "{} bytes, more than the {MAX_STRING_BYTES} CSI allows",
                value.len()
            ),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(invalid(field, "contains a control character"));
    }
    Ok(())
}

/// A map: at most 4 KiB of keys and values together, no control characters in either.
pub fn check_map(field: &'static str, map: &HashMap<String, String>) -> Result<(), ValidationError> {
    let bytes: usize = map.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > MAX_MAP_BYTES {
        return Err(invalid(
            field,
            format!("{bytes} bytes, more than the {MAX_MAP_BYTES} CSI allows"),
        ));
    }
    if let Some(key) = map
        .iter()
        .find(|(k, v)| k.chars().chain(v.chars()).any(char::is_control))
        .map(|(k, _)| k)
    {
        return Err(invalid(
            field,
            format!("{:?} contains a control character", truncated(key)),
        ));
    }
    Ok(())
}

/// A node call's volume context: bounded, and only keys localvol knows.
pub fn check_context(map: &HashMap<String, String>) -> Result<(), ValidationError> {
    check_map("volume_context", map)?;
    let mut unknown: Vec<&str> = map
        .keys()
        .map(String::as_str)
        .filter(|k| !CONTEXT_KEYS.contains(k))
        .collect();
    if !unknown.is_empty() {
        unknown.sort_unstable();
        let unknown: Vec<&str> = unknown.into_iter().map(truncated).collect();
        return Err(invalid(
            "volume_context",
            format!("unknown keys {unknown:?}: localvol reads only {CONTEXT_KEYS:?}"),
        ));
    }
    Ok(())
}

/// At most 64 bytes of `s` for an error message, cut at a character boundary.
fn truncated(s: &str) -> &str {
    let mut end = s.len().min(64);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn names_are_bounded_and_printable() {
        assert!(check_name("name", &"n".repeat(128)).is_ok());
        assert!(check_name("name", &"n".repeat(129)).is_err());
        for bad in ["a\0b", "a\nb", "a\u{7f}b", "\u{1b}[31m"] {
            assert!(check_name("name", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn maps_are_bounded_and_printable() {
        assert!(check_map("m", &map(&[("k", &"v".repeat(4095))])).is_ok());
        assert!(check_map("m", &map(&[("k", &"v".repeat(4096))])).is_err());
        assert!(check_map("m", &map(&[("k", &"v".repeat(64 << 10))])).is_err());
        assert!(check_map("m", &map(&[("k\0", "v")])).is_err());
        assert!(check_map("m", &map(&[("k", "v\n")])).is_err());
    }

    #[test]
    fn only_known_context_keys_pass() {
        let kubelet = map(&[
            (CONTEXT_POD_NAME, "web-0"),
            (CONTEXT_POD_NAMESPACE, "ns"),
            (CONTEXT_POD_UID, "u"),
            (CONTEXT_SERVICE_ACCOUNT, "default"),
            (CONTEXT_EPHEMERAL, "false"),
            (
                CONTEXT_PROVISIONER_IDENTITY,
                "1700000000000-8081-localvol.csi.dev",
            ),
            (PARAM_PVC_NAME, "data"),
            (PARAM_PVC_NAMESPACE, "ns"),
            (PARAM_PV_NAME, "pvc-1"),
            (PARAM_DEVICE_CLASS, "default"),
        ]);
        assert!(check_context(&kubelet).is_ok());
        for key in [
            "fsType",
            "mkfsOptions",
            "csi.storage.k8s.io/serviceAccount.tokens",
            "",
        ] {
            let err = check_context(&map(&[(key, "x")])).unwrap_err();
            assert!(err.to_string().contains("unknown keys"), "{key:?}: {err}");
        }
    }
}
