//! `localvol reclaim VOLUME_ID | --all`: one ReclaimSpace run now, through the running
//! daemon's csi-addons socket (so it takes the same volume lock and concurrency slot as
//! a scheduled run), printing what was reclaimed.
//!
//! `--all` lists the node's volumes with the CSI socket's ListVolumes (the csi-addons
//! API has no listing) and asks for each; the daemon finds each volume's mount itself,
//! and a volume that is not staged is reported as skipped.

use std::path::Path;

use anyhow::{Context, bail};
use clap::Args;
use tonic::transport::Channel;

use crate::csi::addons::OUTCOME_HEADER;
use crate::csi::socket::{self, endpoint_path};
use crate::proto::csi::v1 as csi;
use crate::proto::reclaimspace::{self as rs, reclaim_space_node_client::ReclaimSpaceNodeClient};

#[derive(Debug, Clone, Args)]
pub struct ReclaimCommand {
    /// The volume id (the PV's spec.csi.volumeHandle).
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub volume_id: Option<String>,
    /// Every volume on this node.
    #[arg(long)]
    pub all: bool,
    /// The daemon's csi-addons socket (its --csi-addons-endpoint).
    #[arg(
        long,
        env = "LOCALVOL_CSI_ADDONS_ENDPOINT",
        default_value = "unix:///var/lib/localvol/csi-addons.sock"
    )]
    pub endpoint: String,
    /// The daemon's CSI socket, to list the volumes for --all.
    #[arg(
        long,
        env = "LOCALVOL_ENDPOINT",
        default_value = "unix:///var/lib/localvol/csi.sock"
    )]
    pub csi_endpoint: String,
}

/// A gRPC channel to the daemon's unix socket at `path`.
pub async fn connect(path: &Path) -> anyhow::Result<Channel> {
    socket::connect(path)
        .await
        .with_context(|| format!("connecting to {}", path.display()))
}

async fn list_volumes(csi_endpoint: &str) -> anyhow::Result<Vec<String>> {
    let channel = connect(&endpoint_path(csi_endpoint)?).await?;
    let mut client = csi::controller_client::ControllerClient::new(channel);
    let mut ids = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_volumes(csi::ListVolumesRequest {
                max_entries: 0,
                starting_token: token,
            })
            .await
            .context("ListVolumes")?
            .into_inner();
        ids.extend(
            page.entries
                .into_iter()
                .filter_map(|e| e.volume.map(|v| v.volume_id)),
        );
        if page.next_token.is_empty() {
            return Ok(ids);
        }
        token = page.next_token;
    }
}

/// `1.5 MiB (1572864 bytes)`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {} ({n} bytes)", UNITS[unit])
    }
}

/// One line for a successful run: the usage figures when there are any, else the
/// daemon's own words (a raw block volume).
pub fn describe(response: &rs::NodeReclaimSpaceResponse, outcome: Option<&str>) -> String {
    let usage = |u: &Option<rs::StorageConsumption>| u.as_ref().map(|c| c.usage_bytes.max(0) as u64);
    match (usage(&response.pre_usage), usage(&response.post_usage)) {
        (Some(pre), Some(post)) => format!(
            "reclaimed {}; usage {} -> {}{}",
            bytes(pre.saturating_sub(post)),
            bytes(pre),
            bytes(post),
            outcome.map(|o| format!(" [{o}]")).unwrap_or_default()
        ),
        _ => outcome
            .unwrap_or("done; the daemon reported no usage")
            .to_string(),
    }
}

pub async fn run(args: ReclaimCommand) -> anyhow::Result<()> {
    let ids = match &args.volume_id {
        Some(id) => vec![id.clone()],
        None => list_volumes(&args.csi_endpoint).await?,
    };
    let mut client = ReclaimSpaceNodeClient::new(connect(&endpoint_path(&args.endpoint)?).await?);
    let (mut reclaimed, mut failed) = (0u64, 0usize);
    for id in &ids {
        let request = rs::NodeReclaimSpaceRequest {
            volume_id: id.clone(),
            ..Default::default()
        };
        match client.node_reclaim_space(request).await {
            Ok(response) => {
                let outcome = response
                    .metadata()
                    .get(OUTCOME_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                let reply = response.into_inner();
                if let (Some(pre), Some(post)) = (&reply.pre_usage, &reply.post_usage) {
                    reclaimed += (pre.usage_bytes - post.usage_bytes).max(0) as u64;
                }
                println!("{id}: {}", describe(&reply, outcome.as_deref()));
            }
            Err(status) if args.all && status.code() == tonic::Code::FailedPrecondition => {
                println!("{id}: skipped: {}", status.message());
            }
            Err(status) => {
                eprintln!("{id}: failed ({:?}): {}", status.code(), status.message());
                failed += 1;
            }
        }
    }
    if args.all {
        println!("{} volume(s); reclaimed {} in total", ids.len(), bytes(reclaimed));
    }
    if failed > 0 {
        bail!("{failed} of {} volume(s) failed", ids.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_well() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(64 << 20), "64.0 MiB (67108864 bytes)");
        assert_eq!(bytes(1536), "1.5 KiB (1536 bytes)");
    }

    #[test]
    fn lines_say_what_happened() {
        let trimmed = rs::NodeReclaimSpaceResponse {
            pre_usage: Some(rs::StorageConsumption {
                usage_bytes: 70 << 20,
            }),
            post_usage: Some(rs::StorageConsumption { usage_bytes: 6 << 20 }),
        };
        let line = describe(&trimmed, None);
        assert!(line.starts_with("reclaimed 64.0 MiB"), "{line}");
        assert!(line.contains("70.0 MiB (73400320 bytes) -> 6.0 MiB"), "{line}");
        let block = describe(
            &rs::NodeReclaimSpaceResponse::default(),
            Some("not discarded: raw block volume (discarding it would destroy data)"),
        );
        assert!(block.starts_with("not discarded"), "{block}");
    }
}
