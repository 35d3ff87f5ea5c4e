"""The SageMaker side of the steps: the SDK version guard, the training-session client, the tokenizer,
and the model artifact (model.json) that TrainDAPO writes and EvaluateModel and ApproveModel read."""
