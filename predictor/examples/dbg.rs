use switchyard_predictor::*;
fn main() {
    let t = std::time::Instant::now();
    let data = data::ProfileData::load(&eval::default_train_dir()).unwrap();
    eprintln!("load {:?}", t.elapsed());
    let t = std::time::Instant::now();
    let set = measured::MeasuredSet::build(&data).unwrap();
    eprintln!("set {:?}", t.elapsed());
    let t = std::time::Instant::now();
    let f = estimators::formula::Formula::calibrate(&data).unwrap();
    eprintln!("formula {:?} {:?}", t.elapsed(), f);
    let t = std::time::Instant::now();
    let g = estimators::gbdt::Gbdt::train(&data).unwrap();
    eprintln!("gbdt {:?}", t.elapsed());
    let t = std::time::Instant::now();
    let gr = estimators::graph_device::GraphDevice::train(&data).unwrap();
    eprintln!("graph {:?}", t.elapsed());
    use estimators::Predict;
    let t = std::time::Instant::now();
    let mut n = 0;
    for c in set.configs.iter().step_by(500) {
        let d = set.device(c).unwrap();
        let r = set.raw(c);
        let pg = g.pass_time(&set.graphs[c.graph], &c.pass, d, graph::Coverage::Profiled);
        let pr = gr.pass_time(&set.graphs[c.graph], &c.pass, d, graph::Coverage::Profiled);
        println!("{} {} tp{} tok{} meas {:.5} gbdt {:.5} graph {:.5}", r.model, r.device, r.tensor_parallel, r.tokens, c.seconds, pg, pr);
        n += 1;
    }
    eprintln!("predict {n} {:?}", t.elapsed());
}
