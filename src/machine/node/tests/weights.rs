//! The trainer's weights on the node: updates of the same layout fan out to every
//! worker; an update the policy cannot use fails the node at once, naming why.

use super::*;

fn update(m: &mut NodeMachine, w: Arc<Weights>) -> Vec<NodeOutput> {
    let mut out = Vec::new();
    m.handle(ToNode::UpdateWeights(UpdateWeights { weights: w }), &mut out)
        .unwrap();
    out
}

#[test]
fn an_update_of_the_same_layout_goes_to_every_worker_and_is_acknowledged() {
    let spec = spec(0, 2, 0);
    let mut m = machine(&spec).with_weights(weights(1.0, 0));
    let out = update(&mut m, weights(3.0, 4));
    assert_eq!(worker_cmds(&out).iter().map(|(w, _)| *w).collect::<Vec<_>>(), [0, 1]);
    assert!(matches!(
        trainer_msgs(&out)[..],
        [FromNode::WeightsUpdated { node: 0, version: 4 }]
    ));
    assert_eq!(m.weights().map(|w| w.version), Some(4));
    assert!(!m.has_failed());
}

#[test]
fn an_update_the_policy_cannot_use_fails_the_node_naming_the_tensor() {
    let spec = spec(1, 2, 0);
    let mut m = machine(&spec).with_weights(weights(1.0, 0));
    cont(&mut m, 1, 4);
    let mut wrong = Weights::clone(&weights(2.0, 3));
    wrong
        .tensors
        .insert("value".into(), Tensor::F32(ArrayD::from_elem(vec![2], 2.0)));
    let out = update(&mut m, Arc::new(wrong));
    assert!(worker_cmds(&out).is_empty(), "no worker gets weights it would fail on");
    match trainer_msgs(&out)[..] {
        [FromNode::Failed { node: 1, reason }] => {
            assert!(reason.contains("version 3"), "{reason}");
            assert!(reason.contains("`value` must be f32 [1], got f32 [2]"), "{reason}");
        }
        ref other => panic!("{other:?}"),
    }
    assert!(m.has_failed());
    assert_eq!(m.pending_seq(), None, "the Continue in flight is dropped");
    assert_eq!(m.weights().map(|w| w.version), Some(0), "the old weights stay");

    let mut extra = Weights::clone(&weights(2.0, 5));
    extra
        .tensors
        .insert("bias".into(), Tensor::F32(ArrayD::from_elem(vec![1], 0.0)));
    let mut m = machine(&spec).with_weights(weights(1.0, 0));
    match trainer_msgs(&update(&mut m, Arc::new(extra)))[..] {
        [FromNode::Failed { reason, .. }] => assert!(reason.contains("unexpected tensor `bias`"), "{reason}"),
        ref other => panic!("{other:?}"),
    }
}
