"""The LightningModules and the parts of one RL step: rollout, reward, the update (log-probs,
the KL estimators, the optimizer and its schedule), the phases and their timing, the ranks'
agreements, the checkpoint state; and EVO-RAG's reward model."""
