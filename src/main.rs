use clap::Parser;
use localvol::cli::{Cli, Command};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            let config = args.config()?;
            localvol::telemetry::init(config.log_format);
            let shutdown = localvol::app::shutdown_signal();
            localvol::app::serve(config, shutdown).await
        }
        Command::Status(args) => {
            let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr().lock());
            Ok(localvol::cli::status::run(&args, &mut out, &mut err).await?)
        }
        Command::Reclaim(args) => localvol::cli::reclaim::run(args).await,
    }
}
