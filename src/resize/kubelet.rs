//! Whether this node's kubelet reports node expansion in the claim's status itself,
//! which decides `--report-resize-status auto`.
//!
//! kubelet writes `NodeResizeInProgress`, the capacity and the failure values since
//! RecoverVolumeExpansionFailure went beta (on by default) in 1.32. An older kubelet
//! only updates `status.capacity`, so the claim's `allocatedResourceStatuses` would
//! stay at `NodeResizePending` after a node resizer's expansion: localvol reports
//! then. A 1.32+ kubelet with the gate switched off cannot be seen from the API;
//! `--report-resize-status on` is for that case. The version is read from the Node by
//! [`crate::k8s::claim_resize::ResizeApi::kubelet_version`].

/// The first kubelet minor version (of major 1) that reports node expansion.
pub const REPORTING_SINCE_MINOR: u32 = 32;

/// `v1.31.4`, `v1.36.3+k3s1`, `1.30.0-eks-1` → (1, 31); anything else → `None`.
pub fn major_minor(version: &str) -> Option<(u32, u32)> {
    let version = version.strip_prefix('v').unwrap_or(version);
    let mut parts = version.splitn(3, '.');
    let major = parts.next()?.parse().ok()?;
    let minor_part = parts.next()?;
    let digits = minor_part
        .find(|c: char| !c.is_ascii_digit())
        .map_or(minor_part, |end| &minor_part[..end]);
    Some((major, digits.parse().ok()?))
}

/// Whether a kubelet of `version` reports node expansion itself.
pub fn reports_node_expansion(version: &str) -> Option<bool> {
    major_minor(version).map(|(major, minor)| major > 1 || (major == 1 && minor >= REPORTING_SINCE_MINOR))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_decide_who_reports() {
        assert_eq!(major_minor("v1.31.4"), Some((1, 31)));
        assert_eq!(major_minor("v1.36.3+k3s1"), Some((1, 36)));
        assert_eq!(major_minor("1.30.0-eks-1"), Some((1, 30)));
        assert_eq!(major_minor("v1.32-rc"), Some((1, 32)));
        assert_eq!(reports_node_expansion("v1.31.14"), Some(false));
        assert_eq!(reports_node_expansion("v1.32.0"), Some(true));
        assert_eq!(reports_node_expansion("v1.36.3"), Some(true));
        assert_eq!(reports_node_expansion("v2.0.0"), Some(true));
        for bad in ["", "v", "vx.y", "1", "v1.", "v1.x"] {
            assert_eq!(reports_node_expansion(bad), None, "{bad}");
        }
    }
}
