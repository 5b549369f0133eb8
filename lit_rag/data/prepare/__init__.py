"""``lit-rag data``: each paper recipe's data, sampled as its paper describes, from local files."""
