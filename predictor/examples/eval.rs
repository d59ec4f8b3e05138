//! Print the evaluation table (`cargo run -p switchyard-predictor --example eval [-- --json]`).
fn main() -> Result<(), switchyard_predictor::PredictorError> {
    let t = std::time::Instant::now();
    let report =
        switchyard_predictor::eval::run(&switchyard_predictor::eval::default_train_dir(), None)?;
    if std::env::args().any(|a| a == "--json") {
        println!("{}", report.to_json());
    } else {
        println!("{}", report.to_markdown());
    }
    eprintln!("eval took {:?}", t.elapsed());
    Ok(())
}
