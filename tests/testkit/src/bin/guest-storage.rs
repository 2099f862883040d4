//! guest-storage: the testkit's guest storage (`localvol_testkit::guest`) for the shell
//! that remains in the tests/vm guest, so that every VG, thin pool and namespace a test
//! makes is made by one copy of the code. In the guest only (it wipes disks).
//!
//!   guest-storage overlay make CLASS DISK     the storage the configuration CLASS expects
//!   guest-storage overlay remove CLASS DISK   removes it
//!   guest-storage overlay left CLASS          the class's volumes still there, a line each
//!   guest-storage residue [--mounts]          anything of the storage still there, a line each
//!   guest-storage sanity DISK CONFIG LOOP_DIR csi-sanity's storage and configuration; prints
//!                                             "CLASS SIZE EXPAND_SIZE" per class
//!   guest-storage release                     gives back what the VM suite's parts made
//!
//! `left` and `residue` exit 1 when they print anything, so a caller's check is their
//! exit status; the others exit 1 with the failing tool's message.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use localvol_testkit::guest::{self, overlay, sanity};

#[derive(Parser)]
#[command(name = "guest-storage", about = "the tests/vm guest's storage, for its shell")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The storage of a cluster configuration (tests/vm/cluster-guest.sh).
    Overlay {
        #[command(subcommand)]
        step: OverlayStep,
    },
    /// Device-mapper devices and nodes, LVs and fsdax namespaces still there.
    Residue {
        /// Mounts below kubelet's root and localvol's data directory too.
        #[arg(long)]
        mounts: bool,
    },
    /// csi-sanity's storage on DISK and region0, and its configuration (tests/sanity/vm.sh).
    Sanity {
        disk: String,
        config: PathBuf,
        loop_dir: PathBuf,
    },
    /// Gives back what tests/vm_backends.rs and tests/sanity/vm.sh made.
    Release,
}

#[derive(Subcommand)]
enum OverlayStep {
    Make { class: String, disk: String },
    Remove { class: String, disk: String },
    Left { class: String },
}

fn main() -> ExitCode {
    if std::env::var("VMTEST_GUEST").as_deref() != Ok("1") {
        eprintln!("guest-storage: only in the tests/vm guest (it wipes disks)");
        return ExitCode::from(2);
    }
    let found = |lines: Vec<String>| {
        for line in &lines {
            println!("{line}");
        }
        if lines.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    };
    let done = |result: Result<(), String>| match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("guest-storage: {e}");
            ExitCode::FAILURE
        }
    };
    match Cli::parse().command {
        Command::Overlay {
            step: OverlayStep::Make { class, disk },
        } => done(overlay::make(&class, &disk)),
        Command::Overlay {
            step: OverlayStep::Remove { class, disk },
        } => done(overlay::remove(&class, &disk)),
        Command::Overlay {
            step: OverlayStep::Left { class },
        } => match overlay::volumes_left(&class) {
            Ok(left) => found(left),
            Err(e) => done(Err(e)),
        },
        Command::Residue { mounts } => {
            let mut left = overlay::residue();
            if mounts {
                left.extend(overlay::mounts_left());
            }
            found(left)
        }
        Command::Sanity {
            disk,
            config,
            loop_dir,
        } => {
            for (class, sizes) in sanity::make(&disk, &config, &loop_dir).classes {
                println!("{class} {} {}", sizes.size, sizes.expand);
            }
            ExitCode::SUCCESS
        }
        Command::Release => done(guest::release_suite_storage()),
    }
}
