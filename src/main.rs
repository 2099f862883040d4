use clap::Parser;
use localvol::config::{Cli, Command, Config};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            let config = Config::from_args(&args)?;
            localvol::telemetry::init(config.log_format);
            localvol::app::serve(config, localvol::app::shutdown_signal()).await
        }
        Command::Reclaim(args) => localvol::cli::reclaim::run(args).await,
    }
}
