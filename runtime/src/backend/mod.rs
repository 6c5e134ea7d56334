//! Compute backends (CPU, CUDA) behind one trait the model is written against.
